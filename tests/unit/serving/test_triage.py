"""Decoding a batch of rank requests: valid ones are ranked (aligned with their records, reply
topics and deadlines); a refused reply_to is answered with an error; a bad record is
dead-lettered and, when its request_id can be read, answered with an error where it asked."""

from __future__ import annotations

import orjson
from aiokafka import ConsumerRecord
from prometheus_client import CollectorRegistry

from schemas import Limits, RankRequest, decode_dead_letter, decode_result, reasons
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.outgoing import ReplyWriter
from scoring.serving.triage import Routing, Triage

ROUTING = Routing(
    results="rank-results", dead_letters="dead-letters", allowed=("svc-a",), budget_ms=50
)


def record(value: bytes, offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic="rank-requests", partition=0, offset=offset, timestamp=1000, timestamp_type=0,
        key=b"u", value=value, checksum=None, serialized_key_size=1,
        serialized_value_size=len(value), headers=(),
    )  # fmt: skip


def triage() -> tuple[Triage, ScoringMetrics]:
    metrics = ScoringMetrics(CollectorRegistry())
    writer = ReplyWriter(metrics=metrics, served_log_topic=None)
    return Triage(routing=ROUTING, limits=Limits(), metrics=metrics, writer=writer), metrics


def test_a_batch_is_split_into_requests_to_rank_and_answers_now() -> None:
    t, metrics = triage()
    records = [
        record(RankRequest("r1", "u1", ("a", "b")).to_json(), 0),
        record(RankRequest("r2", "u2", ("a",), reply_to="svc-a", deadline_ms=9).to_json(), 1),
        record(RankRequest("r3", "u3", ("a",), reply_to="clicks").to_json(), 2),
        record(
            orjson.dumps({"request_id": "r4", "user_id": "u4", "items": [], "reply_to": "svc-a"}), 3
        ),
        record(b"not json", 4),
    ]
    out = t.batch(records, received=2000)
    assert [i.request.request_id for i in out.valid] == ["r1", "r2"]
    assert [r.offset for r in out.records] == [0, 1]
    assert out.topics == ["rank-results", "svc-a"]
    assert out.deadlines == [1050, 9]  # the default budget from the Kafka timestamp, or its own
    by_topic = [(o.topic, o.key) for o in out.outgoing]
    assert by_topic == [
        ("rank-results", b"r3"),  # reply_to not allowed: refused, on the results topic
        ("dead-letters", b"u"),  # empty items: dead-lettered ...
        ("svc-a", b"r4"),  # ... and answered where it asked
        ("dead-letters", b"u"),  # unreadable: dead-lettered, nobody to answer
    ]
    refused = decode_result(out.outgoing[0].value)
    assert refused.reason is not None
    assert refused.reason.startswith(reasons.REPLY_TO_NOT_ALLOWED)
    assert decode_dead_letter(out.outgoing[1].value).offset == 3
    assert reasons.is_error_reply(decode_result(out.outgoing[2].value))
    assert metrics.registry.get_sample_value("streamrank_scoring_dead_letters_total", {
        "reason": decode_dead_letter(out.outgoing[3].value).reason
    }) == 1  # fmt: skip


def test_a_retrieval_request_gets_the_cascade_budget_by_default() -> None:
    metrics = ScoringMetrics(CollectorRegistry())
    writer = ReplyWriter(metrics=metrics, served_log_topic=None)
    routing = Routing(
        results="rank-results", dead_letters="dead-letters", allowed=(), budget_ms=50,
        retrieval_budget_ms=100,
    )  # fmt: skip
    t = Triage(routing=routing, limits=Limits(), metrics=metrics, writer=writer)
    records = [
        record(RankRequest("r1", "u1", ("a",)).to_json(), 0),
        record(RankRequest("r2", "u1").to_json(), 1),
        record(RankRequest("r3", "u1", deadline_ms=9).to_json(), 2),
    ]
    out = t.batch(records, received=1001)
    assert out.deadlines == [1050, 1100, 9]
