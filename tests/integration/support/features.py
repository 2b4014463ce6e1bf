"""Helpers of the features integration tests: produce, poll, scrape metrics, read dead letters."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from schemas import ClickEvent, DeadLetter, decode_dead_letter
from streamrank import keys
from streamrank.redis.client import redis_client, slot_grouping
from streamrank.redis.pipeline import NodePipeline
from streamrank.settings import Settings
from streams.windows import counted_from_ms, windows_from_settings
from streams.writer import BatchCalls, BatchWriter, SlotOf, assemble


def click(event_id: str, user: str, item: str, ts: int, category: str | None = "drama") -> bytes:
    return orjson.dumps(
        {"event_id": event_id, "user_id": user, "item_id": item, "ts": ts, "category": category}
    )


def counted_at(settings: Settings, newest_ts_ms: int, window: str) -> int:
    """An as-of time (epoch ms) whose closed ``window`` ("1h" or "24h") counts every click from
    ``newest_ts_ms`` back to 55 min (1 h) or 23 h (24 h) before it: the end of its bucket."""
    fine, coarse = windows_from_settings(settings.features)
    return counted_from_ms(newest_ts_ms, fine if window == "1h" else coarse)


async def produce(settings: Settings, messages: Iterable[tuple[bytes | None, bytes]]) -> int:
    producer = AIOKafkaProducer(**settings.kafka.client_kwargs(), acks="all", linger_ms=5)
    await producer.start()
    count = 0
    try:
        for key, value in messages:
            await producer.send(settings.topics.clicks, value, key=key)
            count += 1
        await producer.flush()
    finally:
        await producer.stop()
    return count


async def poll(
    check: Callable[[], Awaitable[Any]], *, timeout_s: float, what: str, every_s: float = 0.2
) -> Any:
    """Call ``check`` until it returns something truthy; fail with ``what`` after the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")


async def sequence_members(settings: Settings, users: Iterable[str]) -> dict[str, list[str]]:
    """Per user, the event ids in its sequence (oldest first)."""
    client = redis_client(settings.redis)
    try:
        pipe = NodePipeline(client)
        users = list(users)
        for user in users:
            key = keys.sequence(user)
            pipe.add(key, "ZRANGE", key, 0, -1)
        replies = await pipe.execute()
    finally:
        await client.aclose()
    return {
        u: [m.decode().split(keys.FIELD_SEP)[0] for m in r]
        for u, r in zip(users, replies, strict=True)
    }


async def read_dead_letters(
    settings: Settings, expected: int, timeout_s: float = 20
) -> list[DeadLetter]:
    consumer = AIOKafkaConsumer(
        settings.topics.dead_letters,
        **settings.kafka.client_kwargs(),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    letters: list[DeadLetter] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(letters) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                letters.extend(decode_dead_letter(r.value) for r in records)
    finally:
        await consumer.stop()
    return letters


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` from a worker's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def get_json(port: int, path: str) -> tuple[int, Any]:
    """``(status, JSON body)`` of GET ``path`` on a worker's HTTP port (4xx/5xx included)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def metric(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def committed_offsets(settings: Settings) -> dict[int, int]:
    consumer = AIOKafkaConsumer(
        **settings.kafka.client_kwargs(),
        group_id=settings.features.app_id,
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        offsets = {
            p: await consumer.committed(TopicPartition(settings.topics.clicks, p))
            for p in range(settings.topics.partitions)
        }
        return {p: o for p, o in offsets.items() if o is not None}
    finally:
        await consumer.stop()


def batch_for(
    settings: Settings, events: list[ClickEvent], now_ms: int, slot_of: SlotOf | None
) -> BatchCalls:
    return assemble(
        events,
        now_ms=now_ms,
        windows=windows_from_settings(settings.features),
        lateness_s=settings.features.counter_lateness_s,
        sequence_length=settings.features.sequence_length,
        sequence_ttl_s=settings.features.sequence_ttl_s,
        dedupe_ttl_s=settings.features.dedupe_ttl_s,
        slot_of=slot_of,
        contract=settings.features.write_contract,
    )


def writer_for(
    settings: Settings, redis: Any, *, slot_of: SlotOf | str | None = "auto"
) -> Callable[..., Any]:
    """``write(events, now_ms)`` as the features worker does it (one call per slot group on a
    cluster, one call on a single server); ``slot_of`` forces a grouping."""
    writer = BatchWriter(redis=redis)
    grouping = slot_grouping(redis) if slot_of == "auto" else slot_of

    async def write(events: list[ClickEvent], now_ms: int) -> int:
        return await writer.apply(batch_for(settings, events, now_ms, grouping))  # type: ignore[arg-type]

    return write
