"""Redis behind Sentinel: the features path writes through the master the Sentinels name, and
when that master is killed mid-stream the batches continue on the promoted replica with every
event applied exactly once (STREAMRANK_REDIS_SENTINELS)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from streams.classify import Record
from streams.metrics import FeatureMetrics
from streams.processor import FeatureProcessor
from streams.reader import FeatureReader
from tests.integration.support.features import counted_at
from workbench.devstack.sentinel import LocalSentinel

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.standalone_only("starts its own master, replica and Sentinels; run once"),
]


def records(topic: str, start: int, n: int, users: list[str], now_ms: int) -> list[Record]:
    out = []
    for k in range(start, start + n):
        user = users[k % len(users)]
        body = {
            "event_id": f"{topic}-e{k:06d}",
            "user_id": user,
            "item_id": f"i{k % 7}",
            "ts": now_ms,
        }
        out.append(Record(topic, 0, k, user.encode(), orjson.dumps(body)))
    return out


async def test_features_follow_the_master_through_a_sentinel_failover(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path
) -> None:
    sentinel = LocalSentinel(run_dir=tmp_path / "sentinel")
    await asyncio.to_thread(sentinel.start)
    try:
        settings = make_settings(**sentinel.settings(), STREAMRANK_REDIS_WAIT_REPLICAS=1)
        users = [f"{unique}-u{n}" for n in range(12)]
        processor = FeatureProcessor(settings=settings, metrics=FeatureMetrics(CollectorRegistry()))
        await processor.start()
        now = int(time.time() * 1000)
        sent = 0
        try:
            for _ in range(10):  # before the failover
                await processor.process(records(unique, sent, 50, users, now))
                sent += 50
            sentinel.kill_master()
            killed = time.monotonic()
            while time.monotonic() - killed < 8:  # through it: process() retries until promoted
                outcome = await processor.process(records(unique, sent, 50, users, now))
                assert outcome.applied + outcome.duplicates == 50
                sent += 50
            # a replayed batch (at-least-once) changes nothing
            again = await processor.process(records(unique, 0, 50, users, now))
            assert again.applied == 0 and again.duplicates == 50
        finally:
            await processor.stop()
        assert sentinel.current_master_port() == sentinel.replica_port  # the replica took over

        client = redis_client(settings.redis)
        try:
            reader = FeatureReader(redis=client, features=settings.features)
            counters = await reader.get_counters(
                user_ids=users, at_ms=counted_at(settings, now, "24h")
            )
            sequences = await reader.get_sequences(users)
            info = await client.info("server")
        finally:
            await client.aclose()
        assert int(info["tcp_port"]) == sentinel.replica_port  # the client found the new master
        assert sum(c["clicks_24h"] for c in counters["users"].values()) == sent  # once each
        assert all(
            len(s) == min(sent // len(users), settings.features.sequence_length)
            for s in sequences.values()
        )
        assert sent > 500
    finally:
        sentinel.stop()
