"""STREAMRANK_LOG_FORMAT=json: one JSON object per line, every `extra=` field a key of its own."""

from __future__ import annotations

import io
import logging

import orjson

from streamrank.runtime import logs


def emit(log_format: str, **extra: object) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter(log_format))
    logger = logging.getLogger(f"test-logs-{log_format}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.warning("reply to %s: %s", "r1", "degraded", extra=extra)
    return stream.getvalue()


def test_json_lines_carry_the_request_and_record_fields() -> None:
    line = emit(
        "json",
        **logs.request_fields("r1", "u1", "din-1"),
        **logs.record_fields("rank-requests", 3, 42),
    )
    assert line.count("\n") == 1
    record = orjson.loads(line)
    assert record["message"] == "reply to r1: degraded"
    assert record["level"] == "WARNING" and record["logger"] == "test-logs-json"
    assert {k: record[k] for k in ("request_id", "user_id", "model_version")} == {
        "request_id": "r1", "user_id": "u1", "model_version": "din-1",
    }  # fmt: skip
    assert (record["topic"], record["partition"], record["offset"]) == ("rank-requests", 3, 42)
    assert "ts" in record and "process" in record


def test_text_is_the_default_and_stays_one_readable_line() -> None:
    line = emit("text", **logs.request_fields("r1", "u1"))
    assert line.rstrip().endswith("WARNING test-logs-text: reply to r1: degraded")
    assert "{" not in line


def test_the_dict_config_matches(tmp_path: object) -> None:
    config = logs.dict_config("debug", "json")
    assert config["root"]["level"] == "DEBUG"
    assert isinstance(config["formatters"]["streamrank"]["()"](), logs.JsonFormatter)
