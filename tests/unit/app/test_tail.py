"""`streamrank tail`'s pure parts: where it starts, what a message is (any bytes), the filters
and the table/JSON formatting."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest

from streamrank.kafka.guard import UndecodableBatch
from streamrank.settings import Settings
from workbench.tail import (
    Filters,
    Message,
    Start,
    header,
    json_line,
    kind_of,
    parse_duration,
    table_row,
)


def record(value: bytes, *, offset: int = 7, key: bytes | None = b"k") -> SimpleNamespace:
    return SimpleNamespace(
        topic="rank-results", partition=2, offset=offset, timestamp=1_700_000_000_123,
        key=key, value=value,
    )  # fmt: skip


def result(**fields: object) -> bytes:
    body = {"request_id": "r1", "user_id": "u1", "items": ["a", "b", "c"],
            "scores": [0.1, 0.98765, 0.5], "model_version": "din-1", "degraded": False,
            "reason": None}  # fmt: skip
    return orjson.dumps({**body, **fields})


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90", "30s", "10m", "2h", "1d", "1.5m")] == [
        90, 30, 600, 7200, 86400, 90,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("ten minutes")


def test_start_positions_stay_inside_the_partition() -> None:
    assert Start("beginning", 0).position(5, 50) == 5
    assert Start("end", 0).position(5, 50) == 50
    assert Start("last", 10).position(5, 50) == 40
    assert Start("last", 100).position(5, 50) == 5
    assert Start("offset", 3).position(5, 50) == 5
    assert Start("offset", 70).position(5, 50) == 50
    assert Start("offset", 20).position(5, 50) == 20
    assert Start("since", 600).position(5, 50, by_time=12) == 12
    assert Start("since", 600).position(5, 50, by_time=None) == 50  # nothing that recent


def test_any_bytes_make_a_message_and_a_line() -> None:
    for raw in (b"\xff\xfe\x00garbage\n", b"", b"[1, 2", b"\x1b[31mred"):
        m = Message.from_record(record(raw))
        assert m.value is None and m.error is not None and m.error.startswith("not JSON")
        line = table_row("results", m)
        assert "\n" not in line and "\x1b" not in line and "\x00" not in line
        assert f"<{m.error}>" in line
        decoded = orjson.loads(json_line(m))
        assert decoded["value"] is None and decoded["error"] == m.error
        assert "\\x" in decoded["raw"] or decoded["raw"] in ("", "[1, 2")
    marker = UndecodableBatch(b"\x00zz", first_offset=3, last_offset=7, error="bad gzip")
    m = Message.from_record(record(marker))
    assert m.error is not None and "offsets 3-7 skipped" in m.error


def test_a_result_row_is_aligned_with_the_header_and_ranks_the_top_items() -> None:
    m = Message.from_record(record(result()))
    row, head = table_row("results", m, top=2), header("results")
    assert head.index("request_id") == row.index("r1")
    assert head.index("user") == row.index("u1")
    assert row.endswith("b 0.9877 c 0.5000 (+1)")  # scores rounded, best first
    degraded = table_row("results", Message.from_record(record(result(degraded=True,
                         reason="expired: deadline passed"))))  # fmt: skip
    assert "degraded expired" in degraded
    line = orjson.loads(json_line(m))
    assert line["value"]["scores"][1] == 0.98765 and line["key"] == "k" and line["offset"] == 7


def test_filters() -> None:
    ok = Message.from_record(record(result()))
    slow = Message.from_record(record(result(request_id="r2", user_id="u2", degraded=True,
                                             reason="expired: late", scores=[0.5, 0.5, 0.5])))  # fmt: skip
    assert Filters().match(ok) and not Filters().active()
    assert Filters(user="u1").match(ok) and not Filters(user="u1").match(slow)
    assert Filters(request_id="r2").match(slow) and not Filters(request_id="r2").match(ok)
    assert Filters(degraded=True).match(slow) and not Filters(degraded=True).match(ok)
    assert Filters(reason="exp").match(slow) and not Filters(reason="exp").match(ok)
    assert Filters(model_version="din-1").match(ok)
    assert not Filters(model_version="din-2").match(ok)
    assert Filters(min_score=0.9).match(ok) and not Filters(min_score=0.9).match(slow)
    assert Filters(min_score=0.0).active()
    bad = Message.from_record(record(b"\xff"))
    assert Filters().match(bad) and not Filters(user="u1").match(bad)


def test_dead_letters_are_filtered_by_their_payload_and_reason() -> None:
    letter = orjson.dumps({"source_topic": "clicks", "partition": 0, "offset": 4,
                           "error": "bad_type: field 'item_id' must be a string",
                           "payload": '{"event_id": "e", "user_id": "u9", "item_id": 5}',
                           "at": 1})  # fmt: skip
    m = Message.from_record(record(letter))
    assert Filters(user="u9", reason="bad_type").match(m)
    assert not Filters(reason="not_json").match(m)
    row = table_row("dead_letters", m)
    assert "clicks[0]@4" in row and "bad_type" in row


def test_topic_kinds_follow_the_settings() -> None:
    s = Settings().with_env(
        STREAMRANK_TOPIC_RESULTS="res",
        STREAMRANK_SERVED_LOG_TOPIC="served",
        STREAMRANK_REPLY_TOPICS_ALLOWED="alt",
    )
    assert [kind_of(t, s) for t in ("res", "alt", "clicks", "dead-letters", "served", "x")] == [
        "results", "results", "clicks", "dead_letters", "served", "other",
    ]  # fmt: skip


def test_a_result_row_shows_cached_and_the_stage_timings() -> None:
    timings = {"retrieval": 1.25, "rank": 3.0, "total": 5.5}
    m = Message.from_record(record(result(cached=True, timings_ms=timings)))
    row, head = table_row("results", m, top=1), header("results")
    assert head.index("flag") == row.index("ok cached")
    assert head.index("ms") == row.index("5.5 ")
    assert row.endswith("b 0.9877 (+2) | retrieval 1.2 rank 3.0")
    both = table_row("results", Message.from_record(record(result(
        degraded=True, reason="retrieval_fallback", cached=True))))  # fmt: skip
    assert "degraded retrieval_fallback cached" in both  # the longest flag is not clipped
    assert table_row("results", Message.from_record(record(result()))).endswith("a 0.1000")


def test_a_request_row_shows_retrieval_top_k_and_scene() -> None:
    retrieval = orjson.dumps({"request_id": "q1", "user_id": "u1", "items": None, "top_k": 10,
                              "scene": "home", "deadline_ms": None})  # fmt: skip
    row, head = table_row("requests", Message.from_record(record(retrieval))), header("requests")
    for column, value in (("items", "-"), ("top_k", "10"), ("scene", "home")):
        assert row[head.index(column) :].startswith(value), (column, row)
    ranked = orjson.dumps({"request_id": "q2", "user_id": "u1", "items": ["a", "b"]})
    row = table_row("requests", Message.from_record(record(ranked)))
    assert row[head.index("items") :].startswith("2 ")
    assert row[head.index("top_k") :].startswith("- ")
    assert row[head.index("scene") :].startswith("default")
