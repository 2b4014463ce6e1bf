"""Hostile and odd input through Kafka, into running workers (real processes): every message
is accounted for (applied, or answered, or dead-lettered with a reason) and the workers stay up.

A property-based corpus (hypothesis) of ClickEvents and RankRequests, valid and not (wrong
types, missing and extra fields, huge lists and strings, non-UTF-8, NaN/Infinity, deeply
nested context, duplicate, unicode, empty and whitespace ids, timestamps at the extremes), and
the size limits at their edges: a 10 MB message, a request with 100,000 items, a 1 MB id, one
user's 10,000 events in one go.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from schemas import DEFAULT_LIMITS, decode_click, decode_dead_letter, decode_request
from streamrank import keys
from streamrank.errors import ContractError
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from tests.conftest import StackInfo
from tests.integration.support.reliability import assert_alive
from tests.integration.support.scoring import item_ids, publish
from tests.unit.schemas.test_contracts_properties import documents
from workbench.devstack.processes import WorkerProcess, start_worker
from workbench.devstack.servers import private_redis

pytestmark = pytest.mark.timeout(900)

Message = tuple[bytes | None, bytes]  # key, value


@dataclass
class Hostile:
    settings: Settings
    workers: tuple[WorkerProcess, ...]
    items: list[str]


@pytest.fixture(scope="module")
def hostile(
    stack: StackInfo, tmp_path_factory: pytest.TempPathFactory, tiny_artifacts: tuple[Path, Path]
) -> Iterator[Hostile]:
    """A features and a scoring worker (processes) on topics and a Redis of this module."""
    tag = uuid.uuid4().hex[:8]
    tmp = tmp_path_factory.mktemp("hostile")
    with private_redis(tmp / "redis", persist="none") as server:
        s = stack.settings(
            STREAMRANK_REDIS_URL=server.url, STREAMRANK_TOPIC_CLICKS=f"clicks-{tag}", STREAMRANK_TOPIC_REQUESTS=f"requests-{tag}",
            STREAMRANK_TOPIC_RESULTS=f"results-{tag}", STREAMRANK_TOPIC_DEAD_LETTERS=f"dead-{tag}",
            STREAMRANK_FEATURES_APP_ID=f"features-{tag}", STREAMRANK_SCORING_GROUP_ID=f"scoring-{tag}",
            STREAMRANK_SCORING_BUDGET_MS=10_000, STREAMRANK_SEQUENCE_LENGTH=100_000,
        )  # fmt: skip

        async def prepare() -> None:
            await create_topics(s)
            client = redis_client(s.redis)
            try:
                await client.set(keys.active_model(), await publish(client, tiny_artifacts[0]))
            finally:
                await client.aclose()

        asyncio.run(prepare())
        workers = tuple(
            start_worker(kind, s, log_path=tmp / f"{kind}.log") for kind in ("features", "scoring")
        )
        try:
            for worker in workers:
                worker.wait_ready(120)
            yield Hostile(s, workers, item_ids(tiny_artifacts[0])[:50])
        finally:
            for worker in workers:
                worker.stop()


# --- Kafka helpers ----------------------------------------------------------------------------


async def produce(
    settings: Settings, topic: str, messages: Sequence[Message]
) -> list[tuple[int, int]]:
    """Send each message as it is; its (partition, offset)."""
    producer = AIOKafkaProducer(**settings.kafka.client_kwargs(), acks="all", linger_ms=5,
                                max_request_size=16 * 1024 * 1024)  # fmt: skip
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in messages]
        return [(m.partition, m.offset) for m in await asyncio.gather(*futures)]
    finally:
        await producer.stop()


async def read_all(settings: Settings, topic: str, *, until: Any, timeout_s: float) -> list[Any]:
    """Every record of ``topic`` from the beginning, re-read until ``until(records)`` holds."""
    deadline = time.monotonic() + timeout_s
    while True:
        consumer = AIOKafkaConsumer(topic, **settings.kafka.client_kwargs(),
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    fetch_max_bytes=64 * 1024 * 1024,
                                    max_partition_fetch_bytes=64 * 1024 * 1024)  # fmt: skip
        await consumer.start()
        records: list[Any] = []
        try:
            idle = 0
            while idle < 3:
                batch = await consumer.getmany(timeout_ms=300)
                got = [r for part in batch.values() for r in part]
                records.extend(got)
                idle = 0 if got else idle + 1
        finally:
            await consumer.stop()
        if until(records) or time.monotonic() > deadline:
            return records
        await asyncio.sleep(1.0)


async def sequences(settings: Settings, users: Sequence[str]) -> dict[str, list[str]]:
    client = redis_client(settings.redis, timeout_s=10)
    try:
        pipe = client.pipeline(transaction=False)
        for user in users:
            pipe.zrange(keys.sequence(user), 0, -1)
        replies = await pipe.execute()
    finally:
        await client.aclose()
    return {u: [m.decode().split(keys.FIELD_SEP)[0] for m in r]
            for u, r in zip(users, replies, strict=True)}  # fmt: skip


# --- accounting -------------------------------------------------------------------------------


async def account(
    h: Hostile, clicks: Sequence[Message], requests: Sequence[Message]
) -> dict[str, int]:
    """Produce both corpora and check that every message is accounted for."""
    s = h.settings
    click_at = await produce(s, s.topics.clicks, clicks)
    request_at = await produce(s, s.topics.requests, requests)
    valid_clicks = {}
    for _key, value in clicks:
        try:
            event = decode_click(value)
        except ContractError:
            continue
        if abs(event.ts - time.time() * 1000) <= s.limits.max_event_skew_s * 1000:
            # the store applies each (user, event_id) once: two users' clicks sharing an
            # event_id are two events for their sequences
            valid_clicks.setdefault((event.user_id, event.event_id), event)
    expected_letters = {(s.topics.clicks, p, o) for p, o in click_at}
    expected_letters |= {(s.topics.requests, p, o) for p, o in request_at}

    def letters_of(records: list[Any]) -> dict[tuple[str, int, int], str]:
        out = {}
        for record in records:
            letter = decode_dead_letter(record.value)
            out[(letter.source_topic, letter.partition, letter.offset)] = letter.reason
        return out

    # Dead letters: every record that is neither a valid click nor a valid request must have one.
    def settled(records: list[Any]) -> bool:
        return len(letters_of(records).keys() & expected_letters) >= len(invalid)

    invalid = [
        (s.topics.clicks, p, o)
        for (p, o), (_k, v) in zip(click_at, clicks, strict=True)
        if not _valid_click(v, s)
    ]
    invalid += [(s.topics.requests, p, o) for (p, o), (_k, v) in zip(request_at, requests, strict=True)
                if not _valid_request(v)]  # fmt: skip
    letters = letters_of(await read_all(s, s.topics.dead_letters, until=settled, timeout_s=120))
    missing = [where for where in invalid if where not in letters]
    assert not missing, f"{len(missing)} invalid messages without a dead letter: {missing[:5]}"
    assert all(letters[where] for where in invalid), "a dead letter without a reason"
    wrongly = [where for where in letters.keys() & expected_letters if where not in set(invalid)]
    assert not wrongly, f"valid messages dead-lettered: {[letters[w] for w in wrongly][:5]}"

    # Valid clicks: applied, once each.
    users = sorted({user for user, _event_id in valid_clicks})
    deadline = time.monotonic() + 120
    while True:
        seqs = await sequences(s, users)
        present = {(user, e) for user, events in seqs.items() for e in events}
        if set(valid_clicks) <= present or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    lost = set(valid_clicks) - present
    assert not lost, f"{len(lost)} valid clicks not applied: {sorted(lost)[:5]}"
    for user, events in seqs.items():
        assert len(events) == len(set(events)), f"{user}: an event applied twice"

    # Requests: every valid request answered with scores; every readable id answered.
    want = {}
    for _key, value in requests:
        try:
            want[decode_request(value).request_id] = "scores"
        except ContractError:
            rid = _peek_id(value)
            if rid is not None:
                want.setdefault(rid, "error")

    def answered(records: list[Any]) -> bool:
        return set(want) <= {orjson.loads(r.value)["request_id"] for r in records}

    replies = await read_all(s, s.topics.results, until=answered, timeout_s=120)
    got: dict[str, dict[str, Any]] = {}
    for record in replies:
        reply = orjson.loads(record.value)
        got.setdefault(reply["request_id"], reply)
    missing_replies = [rid for rid in want if rid not in got]
    assert not missing_replies, f"{len(missing_replies)} unanswered: {missing_replies[:5]}"
    for rid, kind in want.items():
        if kind == "scores" and got[rid]["items"]:
            assert len(got[rid]["scores"]) == len(got[rid]["items"]), rid
    assert_alive(*h.workers)
    reasons = Counter(letters[where] for where in invalid)
    return {"clicks": len(clicks), "requests": len(requests), "dead_letters": len(invalid),
            "applied": len(valid_clicks), "answered": len(want), "reasons": dict(reasons)}  # fmt: skip


def _valid_click(value: bytes, s: Settings) -> bool:
    try:
        event = decode_click(value)
    except ContractError:
        return False
    return abs(event.ts - time.time() * 1000) <= s.limits.max_event_skew_s * 1000


def _valid_request(value: bytes) -> bool:
    try:
        decode_request(value)
    except ContractError:
        return False
    return True


def _peek_id(value: bytes) -> str | None:
    """The request_id the worker can answer an invalid request to (as the worker reads it)."""
    from schemas import peek_request_id

    rid = peek_request_id(value)
    return rid if rid is not None and len(rid) <= DEFAULT_LIMITS.max_id_length else None


# --- size limits ------------------------------------------------------------------------------


async def test_size_limits_hold_end_to_end(hostile: Hostile) -> None:
    s, tag = hostile.settings, uuid.uuid4().hex[:6]
    now = int(time.time() * 1000)
    ten_mb = 10 * 1024 * 1024
    clicks: list[Message] = [
        (b"u", orjson.dumps({"event_id": f"{tag}-big", "user_id": "u", "item_id": "i",
                             "ts": now, "pad": "x" * ten_mb})),  # a 10 MB message
        (b"u", orjson.dumps({"event_id": "e" * (1 << 20), "user_id": "u", "item_id": "i",
                             "ts": now})),  # a 1 MB id
        (b"u", b"\xff" * ten_mb),  # 10 MB of non-UTF-8
    ]  # fmt: skip
    one_user = f"{tag}-heavy"
    clicks += [(one_user.encode(), orjson.dumps({"event_id": f"{tag}-h{k}", "user_id": one_user,
                                                 "item_id": f"i{k % 97}", "ts": now + k}))
               for k in range(10_000)]  # fmt: skip
    requests: list[Message] = [
        (b"u", orjson.dumps({"request_id": f"{tag}-r-100k", "user_id": "u",
                             "items": [f"i{k}" for k in range(100_000)]})),
        (b"u", orjson.dumps({"request_id": f"{tag}-r-10mb", "user_id": "u", "items": ["a"],
                             "context": {"pad": "x" * ten_mb}})),
        (b"u", orjson.dumps({"request_id": "r" * (1 << 20), "user_id": "u", "items": ["a"]})),
        (b"u", orjson.dumps({"request_id": f"{tag}-r-500", "user_id": "u",
                             "items": hostile.items[:10] * 50})),  # 500 items: the limit
        (b"u", orjson.dumps({"request_id": f"{tag}-r-501", "user_id": "u",
                             "items": hostile.items[:1] * 501})),
    ]  # fmt: skip
    counts = await account(hostile, clicks, requests)
    print(f"\nRELIABILITY-INPUT size limits: {orjson.dumps(counts).decode()}")
    client = redis_client(s.redis)
    try:
        from streams.reader import FeatureReader
        from tests.integration.support.features import counted_at

        counters = await FeatureReader(redis=client, features=s.features).get_counters(
            user_ids=[one_user], at_ms=counted_at(s, now + 10_000, "1h")
        )
    finally:
        await client.aclose()
    assert counters["users"][one_user]["clicks_1h"] == 10_000


# --- the property-based corpus ----------------------------------------------------------------

unicode_ids = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=24
)
odd_ids = st.sampled_from(["", " ", "\t", "   ", "é", "😀", "用户", "\u200b", "a\x1fb", "x" * 129,
                           "x" * 128, "0", "null", "\ufeff"])  # fmt: skip
extreme_ts = st.sampled_from([0, -1, 1, 2**31, 2**53, 2**63 - 1, 2**63, 2**64, 10**30,
                              1.5e300, -(2**63)])  # fmt: skip


def deeply_nested(depth: int) -> bytes:
    return b'{"request_id":"deep-%d","user_id":"u","items":["a"],"context":' % depth + (
        b'{"a":' * depth + b"1" + b"}" * depth + b"}"
    )


def dumps(value: Any) -> bytes:
    """JSON as any producer may write it: integers beyond 64 bits included (orjson refuses
    them)."""
    return json.dumps(value).encode()


Drawn = tuple[str, bytes | None, bytes]  # kind, key, value


@st.composite
def click_messages(draw: st.DrawFn, tag: str) -> Drawn:
    now = int(time.time() * 1000)
    kind = draw(st.sampled_from(["valid", "valid", "document", "odd", "binary", "nan",
                                 "huge", "extreme_ts", "unkeyed"]))  # fmt: skip
    if kind == "document":  # wrong types, missing and extra fields
        doc = draw(documents("ClickEvent"))
        if isinstance(doc, dict) and isinstance(doc.get("event_id"), str):  # unique to the example
            doc["event_id"] = f"{tag}-{doc['event_id']}"
        return kind, (None if draw(st.booleans()) else b"k"), dumps(doc)
    if kind == "binary":
        return kind, b"u", draw(st.binary(max_size=200))
    if kind == "nan":
        return kind, b"u", b'{"event_id":"e","user_id":"u","item_id":"i","ts":NaN}'
    if kind == "huge":
        body = {"event_id": "e", "user_id": "u", "item_id": "i" * 300_000, "ts": now}
        return kind, b"u", dumps(body)
    # Event ids carry the tag: a seen-marker of another example must not hide this one's click.
    event_id = f"{tag}-{draw(unicode_ids if kind != 'odd' else odd_ids)}"
    user = draw(unicode_ids) if kind != "odd" else draw(odd_ids)
    body = {"event_id": event_id, "user_id": user, "item_id": draw(unicode_ids), "ts": now}
    if kind == "extreme_ts":
        body["ts"] = draw(extreme_ts)
    key = None if kind == "unkeyed" else user.encode()
    return kind, key, dumps(body)


@st.composite
def request_messages(draw: st.DrawFn, tag: str, items: list[str]) -> Drawn:
    kind = draw(st.sampled_from(["valid", "valid", "document", "odd", "binary", "nested",
                                 "huge_list", "infinity", "duplicate"]))  # fmt: skip
    if kind == "document":
        return kind, b"u", dumps(draw(documents("RankRequest")))
    if kind == "binary":
        return kind, b"u", draw(st.binary(max_size=200))
    if kind == "nested":
        return kind, b"u", deeply_nested(draw(st.sampled_from([10, 200, 1000, 5000])))
    if kind == "infinity":
        raw = b'{"request_id":"inf","user_id":"u","items":["a"],"deadline_ms":Infinity}'
        return kind, b"u", raw
    if kind == "huge_list":
        n = draw(st.sampled_from([501, 5000, 20000]))
        return kind, b"u", dumps({"request_id": f"{tag}-list", "user_id": "u", "items": ["a"] * n})
    rid = f"{tag}-dup" if kind == "duplicate" else f"{tag}-{draw(unicode_ids)}"
    if kind == "odd":
        rid = draw(odd_ids)
    body = {
        "request_id": rid,
        "user_id": draw(unicode_ids if kind != "odd" else odd_ids),
        "items": draw(st.lists(st.sampled_from(items) | unicode_ids, min_size=1, max_size=20)),
    }
    return kind, b"u", dumps(body)


# Each example is a corpus through real workers (seconds): a few examples of a few dozen
# messages (larger corpora overrun hypothesis's buffer and are discarded), no shrinking (a
# failure is reported with its whole corpus).
@settings(max_examples=20, deadline=None, derandomize=True, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(data=st.data())
def test_a_hostile_corpus_is_accounted_for(hostile: Hostile, data: st.DataObject) -> None:
    tag = uuid.uuid4().hex[:6]
    clicks = data.draw(st.lists(click_messages(tag), min_size=20, max_size=40))
    requests = data.draw(st.lists(request_messages(tag, hostile.items), min_size=15, max_size=30))
    clicks += [("retried", k, v) for _kind, k, v in clicks[:3]]  # a producer's retry
    kinds = (Counter(k for k, _, _ in clicks), Counter(k for k, _, _ in requests))
    counts = asyncio.run(account(hostile, [(k, v) for _, k, v in clicks],
                                 [(k, v) for _, k, v in requests]))  # fmt: skip
    print(f"\nRELIABILITY-INPUT corpus: {orjson.dumps(counts).decode()}; kinds "
          f"{dict(kinds[0])} / {dict(kinds[1])}")  # fmt: skip
