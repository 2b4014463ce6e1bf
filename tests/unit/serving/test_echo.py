"""The echo floor's replies: one zero-score reply per valid request, nothing for bad input."""

from __future__ import annotations

from typing import Any

import orjson
from aiokafka import ConsumerRecord

from schemas import Limits, decode_result
from streamrank.settings import Settings
from workbench.bench.echo import ECHO_VERSION, echo_replies


def record(value: bytes, offset: int, ts: int = 1_000) -> ConsumerRecord[Any, Any]:
    return ConsumerRecord("rank-requests", 0, offset, ts, 0, b"k", value, None, 1, len(value), [])


def test_echo_answers_each_valid_request_with_zero_scores() -> None:
    good = orjson.dumps({"request_id": "r1", "user_id": "u1", "items": ["a", "b", "c"]})
    other = orjson.dumps({"request_id": "r2", "user_id": "u2", "items": ["d"]})
    records = [record(good, 0), record(b"{not json", 1), record(other, 2)]
    out = echo_replies(records, Limits.from_settings(Settings().limits))
    assert [r.request_id for r in out] == ["r1", "r2"]
    first = decode_result(out[0].to_json())  # a reply every client can read
    assert first.items == ("a", "b", "c") and first.scores == (0.0, 0.0, 0.0)
    assert first.model_version == ECHO_VERSION and not first.degraded
    assert first.timings_ms["total"] == first.served_at - 1_000
