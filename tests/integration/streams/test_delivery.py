"""Delivery guarantees of the features worker: Redis outage, and a worker killed mid-stream."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from streams.reader import FeatureReader
from tests.integration.support.features import (
    click,
    committed_offsets,
    counted_at,
    metric,
    poll,
    produce,
    scrape,
    sequence_members,
)
from workbench.devstack.processes import start_worker
from workbench.devstack.servers import RedisServer
from workbench.devstack.servers import private_redis as stack_private_redis
from workbench.devstack.services import free_port


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test only, with an append-only file: stopping and starting it
    again keeps the data (a restart, not a wipe)."""
    with stack_private_redis(tmp_path, persist="aof") as server:
        yield server


async def total_clicks(settings: Settings, users: list[str]) -> int:
    client = redis_client(settings.redis)
    try:
        # as of the end of the current fine bucket: every click made in the last 55 min is in
        counters = await FeatureReader(redis=client, features=settings.features).get_counters(
            user_ids=users, at_ms=counted_at(settings, int(time.time() * 1000) + 5000, "1h")
        )
    finally:
        await client.aclose()
    return sum(c["clicks_1h"] for c in counters["users"].values())


@pytest.mark.standalone_only(
    "stops and starts a private redis-server; the cluster's failover is tests/integration/app/test_failover.py"
)
async def test_redis_down_then_back_loses_nothing(
    make_settings, unique, tmp_path, private_redis
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(
        STREAMRANK_FEATURES_APP_ID=f"features-{unique}",
        STREAMRANK_REDIS_URL=private_redis.url,
        STREAMRANK_SEQUENCE_LENGTH=1000,
        STREAMRANK_FEATURES_RETRY_MAX_S=0.5,
    )
    worker = start_worker("features", settings, log_path=tmp_path / "worker.log", metrics_port=None)
    users = [f"u{i}-{unique}" for i in range(5)]
    now = int(time.time() * 1000)

    def batch(start: int, n: int) -> list[tuple[bytes | None, bytes]]:
        return [
            (users[i % 5].encode(), click(f"{unique}-{i:05d}", users[i % 5], f"i{i}", now + i))
            for i in range(start, start + n)
        ]

    async def applied(n: int) -> bool:
        members = await sequence_members(settings, users)
        return sum(len(m) for m in members.values()) == n

    try:
        await asyncio.to_thread(worker.wait_ready, 60)
        await produce(settings, batch(0, 100))
        await poll(lambda: applied(100), timeout_s=20, what="the first 100 clicks")

        private_redis.stop()
        await produce(settings, batch(100, 100))
        await poll(
            lambda: asyncio.sleep(0, "is unavailable" in worker.log_text()),
            timeout_s=15,
            what="the worker to notice the outage",
        )
        await asyncio.sleep(1.5)  # several retries (and commit intervals) while Redis is down
        # Only the first 100 clicks are committed: the batch waiting for Redis is not.
        assert sum((await committed_offsets(settings)).values()) == 100
        private_redis.start()
        await poll(lambda: applied(200), timeout_s=20, what="all 200 clicks after the outage")
        assert await total_clicks(settings, users) == 200
    finally:
        worker.stop()
    log = worker.log_text()
    assert log.count("redis is unavailable") == 1, log[-3000:]
    assert log.count("redis is back") == 1, log[-3000:]


# Killed mid-batch on a cluster, a worker may have applied some slots' script calls and not
# others; the redelivered batch must still count each click once.
@pytest.mark.cluster
async def test_two_workers_one_killed_the_other_continues(make_settings, unique, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ports = (free_port(), free_port())
    base = make_settings(
        STREAMRANK_FEATURES_APP_ID=f"features-{unique}", STREAMRANK_SEQUENCE_LENGTH=1000
    )
    first = start_worker(
        "features",
        base.with_env(STREAMRANK_METRICS_PORT=ports[0]),
        log_path=tmp_path / "w1.log",
        metrics_port=None,
    )
    second = start_worker(
        "features",
        base.with_env(STREAMRANK_METRICS_PORT=ports[1]),
        log_path=tmp_path / "w2.log",
        metrics_port=None,
    )
    users = [f"u{i}-{unique}" for i in range(40)]
    now = int(time.time() * 1000)
    total = 4000
    messages = [
        (users[i % 40].encode(), click(f"{unique}-{i:05d}", users[i % 40], f"i{i % 50}", now + i))
        for i in range(total)
    ]
    try:
        await asyncio.gather(
            asyncio.to_thread(first.wait_ready, 60), asyncio.to_thread(second.wait_ready, 60)
        )

        async def both_assigned() -> bool:
            # Both members joined the same generation of the group: the partitions are split.
            generations = [
                re.findall(r"\(generation (\d+)\)", w.log_text()) for w in (first, second)
            ]
            return all(generations) and generations[0][-1] == generations[1][-1]

        await poll(both_assigned, timeout_s=30, what="both workers to own partitions")
        await produce(settings := base, messages[: total // 2])

        async def first_applied_some() -> float:
            return metric(
                await asyncio.to_thread(scrape, ports[0]),
                "streamrank_features_events_applied_total",
            )

        applied_by_first = await poll(
            first_applied_some, timeout_s=20, what="worker 1 to apply clicks"
        )
        first.kill()  # a crash: whatever it had not committed is redelivered to worker 2
        await produce(settings, messages[total // 2 :])

        async def all_applied() -> bool:
            members = await sequence_members(settings, users)
            return sum(len(m) for m in members.values()) == total

        await poll(all_applied, timeout_s=60, what="every click applied after the kill")
        members = await sequence_members(settings, users)
        flat = [e for m in members.values() for e in m]
        assert sorted(flat) == sorted(f"{unique}-{i:05d}" for i in range(total))  # none lost
        assert await total_clicks(settings, users) == total  # none counted twice
        applied_by_second = metric(
            await asyncio.to_thread(scrape, ports[1]), "streamrank_features_events_applied_total"
        )
        assert applied_by_first > 0 and applied_by_second > 0
        assert applied_by_second < total  # worker 1's share was really worker 1's
    finally:
        first.kill()
        second.stop()
