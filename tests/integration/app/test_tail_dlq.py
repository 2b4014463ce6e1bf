"""`streamrank tail` and `streamrank dlq` as analysts run them, against a scoring worker
answering real requests: a live --follow, filters, JSON lines, --since, unreadable payloads,
no consumer group created, and a dead-letter replay that puts the original bytes back."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from scoring.client import RankClient
from streamrank import keys
from streamrank.kafka import clients as kafka
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from tests.integration.support.scoring import item_ids, publish, read_topic, running_worker

pytestmark = pytest.mark.timeout(240)


async def cli(settings: Settings, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workbench.cli", *args,
        env={**os.environ, **settings.as_env(), "COLUMNS": "200"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


def json_lines(text: str) -> list[dict]:  # type: ignore[type-arg]
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


async def group_ids(settings: Settings) -> set[str]:
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    try:
        return {g[0] for g in await admin.list_consumer_groups()}
    finally:
        await admin.close()


async def produce(settings: Settings, topic: str, records: list[tuple]) -> None:  # type: ignore[type-arg]
    producer = kafka.producer(settings.kafka, acks="all")
    await producer.start()
    try:
        for key, value, *rest in records:
            options = rest[0] if rest else {}
            await producer.send_and_wait(topic, value, key=key, **options)
    finally:
        await producer.stop()


@pytest.fixture
def settings(make_settings: Callable[..., Settings], unique: str) -> Settings:
    return make_settings(
        STREAMRANK_SCORING_GROUP_ID=f"scoring-{unique}", STREAMRANK_SCORING_BUDGET_MS=10_000
    )


async def test_tail_follows_filters_and_never_joins_a_group(
    settings: Settings, unique: str, tiny_artifacts: tuple[Path, Path]
) -> None:
    await create_topics(settings)
    redis = redis_client(settings.redis)
    try:
        version = await publish(redis, tiny_artifacts[0])
    finally:
        await redis.aclose()
    items = item_ids(tiny_artifacts[0])[:6]
    pinned = settings.with_env(STREAMRANK_CANARY_SPLIT=f"{version}:1")
    async with running_worker(pinned), RankClient(settings=settings) as client:
        await client.rank("warm-up", items, timeout=60)
        before = await group_ids(settings)
        follow = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "workbench.cli", "tail", settings.topics.results,
            "--follow", "--json",
            env={**os.environ, **settings.as_env()},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert follow.stdout is not None
        try:
            # the 10 newest first (here: the warm-up reply), then what arrives
            first = orjson.loads(await asyncio.wait_for(follow.stdout.readline(), 60))
            assert first["value"]["user_id"] == "warm-up"
            users = [f"u{i}-{unique}" for i in range(6)]
            sent = [await client.rank(u, items, timeout=30) for u in users]
            expired = await client.rank(
                users[0], items, timeout=30, deadline_ms=int(time.time() * 1000) - 1000
            )
            seen: dict[str, dict] = {}  # type: ignore[type-arg]
            while len(seen) < len(sent) + 1:
                line = await asyncio.wait_for(follow.stdout.readline(), 30)
                value = orjson.loads(line)["value"]
                seen[value["request_id"]] = value
            assert {r.request_id for r in [*sent, expired]} <= set(seen)
        finally:
            follow.send_signal(signal.SIGINT)  # Ctrl-C
            _, err = await asyncio.wait_for(follow.communicate(), 30)
        assert follow.returncode == 0, err
        assert "tail: 8 messages read from" in err.decode() and "8 shown" in err.decode()
        # tail never joined (or created) a consumer group
        assert await group_ids(settings) == before

    results = settings.topics.results
    code, out, err = await cli(
        settings, "tail", results, "--from-beginning", "--user", users[2], "--json"
    )
    assert code == 0, err
    [only] = json_lines(out)
    assert only["value"]["request_id"] == sent[2].request_id and only["topic"] == results
    assert "8 messages read" in err and "1 shown" in err

    code, out, _ = await cli(settings, "tail", results, "--from-beginning", "--degraded", "--json")
    assert [m["value"]["request_id"] for m in json_lines(out)] == [expired.request_id]
    code, out, _ = await cli(
        settings, "tail", results, "--from-beginning", "--reason", "expired", "--json"
    )
    assert [m["value"]["request_id"] for m in json_lines(out)] == [expired.request_id]
    code, out, _ = await cli(settings, "tail", results, "--from-beginning", "--json")
    best = max(max(m["value"]["scores"]) for m in json_lines(out))
    code, out, _ = await cli(
        settings, "tail", results, "--from-beginning", "--min-score", str(best), "--json"
    )
    shown = [max(m["value"]["scores"]) for m in json_lines(out)]
    assert shown and min(shown) >= best
    code, out, _ = await cli(
        settings, "tail", results, "--from-beginning", "--min-score", str(best + 1e-3), "--json"
    )
    assert json_lines(out) == []
    code, out, _ = await cli(settings, "tail", results, "--from-beginning",
                             "--request-id", sent[4].request_id, "--model-version", version, "--json")  # fmt: skip
    assert [m["value"]["user_id"] for m in json_lines(out)] == [users[4]]
    code, out, _ = await cli(
        settings, "tail", results, "--from-beginning", "--limit", "3", "--json"
    )
    assert len(json_lines(out)) == 3

    # the table: a header, aligned columns, rounded scores, the top items
    code, out, err = await cli(settings, "tail", results, "--from-beginning", "--user", users[1])
    head, row = out.splitlines()
    assert head.split()[:4] == ["time", "p:offset", "request_id", "user"]
    assert row[head.index("user") :].startswith(users[1][:11] + "…")  # clipped to its column
    top = sorted(zip(sent[1].scores, sent[1].items, strict=True), reverse=True)[0]
    assert f"{top[1]} {top[0]:.4f}" in row

    # a payload that is not JSON is shown escaped and counted, never a traceback
    await produce(settings, results, [(b"k", b"\xff\x00not json\n")])
    code, out, err = await cli(settings, "tail", results, "--last", "1")
    assert code == 0 and "Traceback" not in err
    assert "<not JSON" in out and "\\xff\\x00not json\\x0a" in out
    assert "1 not valid JSON" in err


async def test_tail_since_reads_by_record_time(settings: Settings, unique: str) -> None:
    topic = f"events-{unique}"
    await create_topics(settings, partitions=2, topics=(topic,))
    now = int(time.time() * 1000)
    old = [(f"k{i}".encode(), b'{"n": "old"}', {"timestamp_ms": now - 7_200_000}) for i in range(3)]
    new = [(f"k{i}".encode(), b'{"n": "new"}', {"timestamp_ms": now - 1_000}) for i in range(2)]
    await produce(settings, topic, old + new)
    code, out, err = await cli(settings, "tail", topic, "--since", "1h", "--json")
    assert code == 0, err
    assert [m["value"]["n"] for m in json_lines(out)] == ["new", "new"]
    code, out, _ = await cli(settings, "tail", topic, "--since", "3h", "--json")
    assert len(json_lines(out)) == 5
    code, out, _ = await cli(settings, "tail", topic, "--offset", "1", "--partition", "0", "--json")
    assert all(m["partition"] == 0 and m["offset"] >= 1 for m in json_lines(out))


async def test_dlq_counts_lists_and_replays_the_original_bytes_and_headers(
    settings: Settings, unique: str
) -> None:
    await create_topics(settings)
    redis = redis_client(settings.redis)
    try:
        await redis.delete(keys.model_split())
    finally:
        await redis.aclose()
    bad = [
        (b"u1", b'{"request_id": "r-bad-1", "user_id": "u1", "items": {}}',
         {"headers": [("traceparent", b"00-abc"), ("bin", b"\xff\x00")]}),
        (b"u2", b'{"request_id": "r-bad-2", "items": ["a"]}', {}),  # no user_id
        (b"u3", b"\xff not json", {}),
    ]  # fmt: skip
    async with running_worker(settings):
        await produce(settings, settings.topics.requests, bad)
        letters = await read_topic(settings, settings.topics.dead_letters, want=3, timeout_s=60)
        assert len(letters) == 3

    code, out, err = await cli(settings, "dlq", "--json")
    assert code == 0, err
    summary = orjson.loads(out)
    assert summary["total"] == 3
    assert {(r["reason"], r["source_topic"], r["count"]) for r in summary["by_reason"]} == {
        ("bad_type", settings.topics.requests, 1),
        ("missing_field", settings.topics.requests, 1),
        ("not_json", settings.topics.requests, 1),
    }
    code, out, _ = await cli(settings, "dlq")
    assert "total" in out and "bad_type" in out and settings.topics.requests in out
    code, out, _ = await cli(settings, "dlq", "--list", "--reason", "not_json")
    assert "not_json" in out.splitlines()[1] and len(out.splitlines()) == 2

    # dry run: nothing is produced
    ends_before = await request_topic_end(settings)
    code, out, _ = await cli(settings, "dlq", "--replay", "--reason", "bad_type")
    assert code == 0 and "would replay 1 dead letters" in out and "--yes" in out
    assert await request_topic_end(settings) == ends_before

    code, out, _ = await cli(
        settings, "dlq", "--replay", "--source-topic", settings.topics.requests, "--yes"
    )
    assert "replayed 3 dead letters" in out, out
    everything = await read_all(settings, settings.topics.requests, want=6)
    assert len(everything) == 6
    replayed = everything[3:]
    assert sorted(r.value for r in replayed) == sorted(v for _k, v, _o in bad)
    by_value = {r.value: r for r in replayed}
    first = by_value[bad[0][1]]
    assert first.key == b"u1" and list(first.headers) == [
        ("traceparent", b"00-abc"),
        ("bin", b"\xff\x00"),
    ]
    assert by_value[b"\xff not json"].key == b"u3"


async def request_topic_end(settings: Settings) -> int:
    consumer = kafka.consumer(settings.kafka, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        from aiokafka import TopicPartition

        tps = [
            TopicPartition(settings.topics.requests, p) for p in range(settings.topics.partitions)
        ]
        return sum((await kafka.end_offsets(consumer, tps)).values())
    finally:
        await consumer.stop()


async def read_all(settings: Settings, topic: str, *, want: int) -> list:  # type: ignore[type-arg]
    """Every record of ``topic`` (at least ``want``), oldest first."""
    consumer = kafka.consumer(settings.kafka, topic, group_id=None, enable_auto_commit=False,
                              auto_offset_reset="earliest")  # fmt: skip
    await consumer.start()
    out: list = []  # type: ignore[type-arg]
    try:
        deadline = time.monotonic() + 30
        while len(out) < want and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            out.extend(r for records in batch.values() for r in records)
    finally:
        await consumer.stop()
    return sorted(out, key=lambda r: (r.timestamp, r.partition, r.offset))
