"""Redis failover errors under the features worker (fault 7 of docs/reliability.md): a replica
refusing writes (``READONLY``, raised inside the batch script), a restarted Redis loading its
data (``LOADING``), and a connection lost after the script ran but before its reply arrived.
Each is retried like a connection failure and nothing is applied twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from streams.classify import Record
from streams.metrics import FeatureMetrics
from streams.processor import FeatureProcessor
from streams.reader import FeatureReader
from tests.integration.support.faults import ReplyDroppingProxy, wait_replicated
from tests.integration.support.features import (
    click,
    counted_at,
    poll,
    produce,
    sequence_members,
)
from workbench.devstack.processes import WorkerProcess, start_worker
from workbench.devstack.servers import private_redis

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.standalone_only(
        "starts its own standalone redis-server (the cluster pass would repeat it)"
    ),
]


def clicks(unique: str, users: list[str], start: int, n: int) -> list[tuple[bytes | None, bytes]]:
    now = int(time.time() * 1000)
    out: list[tuple[bytes | None, bytes]] = []
    for i in range(start, start + n):
        user = users[i % len(users)]
        out.append((user.encode(), click(f"{unique}-{i:05d}", user, f"i{i % 7}", now + i)))
    return out


async def applied_exactly_once(settings: Settings, users: list[str], unique: str, n: int) -> None:
    """Every one of the first ``n`` clicks is in its user's sequence, and counted once."""
    members = await sequence_members(settings, users)
    assert sorted(e for m in members.values() for e in m) == [f"{unique}-{i:05d}" for i in range(n)]
    client = redis_client(settings.redis)
    try:
        # as of the end of the current fine bucket: every click made in the last 55 min is in
        counters = await FeatureReader(redis=client, features=settings.features).get_counters(
            user_ids=users, at_ms=counted_at(settings, int(time.time() * 1000) + 1000, "1h")
        )
    finally:
        await client.aclose()
    assert sum(c["clicks_1h"] for c in counters["users"].values()) == n


async def wait_applied(settings: Settings, users: list[str], n: int, *, timeout_s: float) -> None:
    async def count() -> bool:
        try:
            members = await sequence_members(settings, users)
        except (RedisConnectionError, RedisTimeoutError):  # still loading (BusyLoadingError is
            # a ConnectionError), or too slow to answer within the socket timeout while it loads
            return False
        return sum(len(m) for m in members.values()) >= n

    await poll(count, timeout_s=timeout_s, what=f"{n} clicks applied")


def features_worker(settings: Settings, tmp_path: Path, name: str) -> WorkerProcess:
    worker = start_worker("features", settings, log_path=tmp_path / f"{name}.log")
    worker.wait_ready(90)
    return worker


async def test_readonly_during_a_failover_is_retried_and_nothing_is_lost(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path
) -> None:
    """The worker's Redis is demoted to a replica (writes refused with READONLY inside the
    batch script: a plain script error for redis-py, which used to crash the worker), then
    promoted back: the batches waiting meanwhile are applied once, and the worker never died."""
    users = [f"ro{i}-{unique}" for i in range(5)]
    with (
        private_redis(tmp_path / "a", persist="none") as primary,
        private_redis(tmp_path / "b", persist="none") as standby,
    ):
        settings = make_settings(
            STREAMRANK_FEATURES_APP_ID=f"features-{unique}",
            STREAMRANK_REDIS_URL=primary.url,
            STREAMRANK_SEQUENCE_LENGTH=1000,
            STREAMRANK_FEATURES_RETRY_MAX_S=0.3,
        )
        a, b = primary.client(), standby.client()
        b.replicaof("127.0.0.1", primary.port)
        worker = features_worker(settings, tmp_path, "ro")
        try:
            await produce(settings, clicks(unique, users, 0, 100))
            await wait_applied(settings, users, 100, timeout_s=30)
            await asyncio.to_thread(wait_replicated, a, b)
            # Failover: the standby is promoted, the old primary follows it (and refuses writes).
            b.replicaof("NO", "ONE")
            a.replicaof("127.0.0.1", standby.port)
            await produce(settings, clicks(unique, users, 100, 100))
            await poll(
                lambda: asyncio.sleep(0, "READONLY" in worker.log_text()),
                timeout_s=30,
                what="the worker to meet READONLY",
            )
            await asyncio.sleep(1.0)  # a few retries against the replica
            assert worker.alive(), worker.log_text()[-3000:]
            await asyncio.to_thread(wait_replicated, b, a)
            a.replicaof("NO", "ONE")  # promoted back: writes are accepted again
            await wait_applied(settings, users, 200, timeout_s=30)
            await applied_exactly_once(settings, users, unique, 200)
            assert worker.alive()
        finally:
            worker.stop()
            a.close()
            b.close()
    log = worker.log_text()
    assert log.count("redis is unavailable") >= 1 and "redis is back" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


async def test_loading_after_a_restart_is_retried_and_nothing_is_lost(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path
) -> None:
    """Redis restarts and loads its data slowly (answering LOADING for seconds): clicks that
    arrive meanwhile wait, are applied once it is loaded, none twice."""
    users = [f"ld{i}-{unique}" for i in range(5)]
    with private_redis(tmp_path, persist="rdb") as server:
        settings = make_settings(
            STREAMRANK_FEATURES_APP_ID=f"features-{unique}",
            STREAMRANK_REDIS_URL=server.url,
            STREAMRANK_SEQUENCE_LENGTH=1000,
            STREAMRANK_FEATURES_RETRY_MAX_S=0.3,
        )
        sync = server.client()
        # Something to load: 3,000 uncompressed 10 KB values. Redis 6.2 answers clients every
        # 2 MB it loads, and --key-load-delay (below) slows the load to a few seconds.
        sync.config_set("rdbcompression", "no")
        sync.execute_command("DEBUG", "POPULATE", 3000, "filler", 10_000)
        sync.close()
        worker = features_worker(settings, tmp_path, "loading")
        try:
            await produce(settings, clicks(unique, users, 0, 100))
            await wait_applied(settings, users, 100, timeout_s=30)
            server.stop()  # SAVE, then stop
            server.extra_args = ("--key-load-delay", "1000", "--rdbcompression", "no")
            server.start(wait_loaded=False)
            await produce(settings, clicks(unique, users, 100, 100))
            await poll(
                lambda: asyncio.sleep(0, "BusyLoadingError" in worker.log_text()),
                timeout_s=30,
                what="the worker to meet LOADING",
            )
            assert worker.alive(), worker.log_text()[-3000:]
            await wait_applied(settings, users, 200, timeout_s=60)
            await applied_exactly_once(settings, users, unique, 200)
        finally:
            worker.stop()
    log = worker.log_text()
    assert "redis is back" in log and "Traceback" not in log, log[-3000:]


async def test_a_batch_applied_before_the_connection_dropped_is_not_applied_twice(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path
) -> None:
    """The script runs, its reply is lost with the connection, the batch is run again: the
    seen-markers the first run set make the second apply nothing."""
    users = [f"cr{i}-{unique}" for i in range(4)]
    with private_redis(tmp_path, persist="none") as server:
        async with ReplyDroppingProxy(server.port) as proxy:
            settings = make_settings(
                STREAMRANK_REDIS_URL=f"redis://127.0.0.1:{proxy.port}/0",
                STREAMRANK_SEQUENCE_LENGTH=1000,
            )
            processor = FeatureProcessor(
                settings=settings, metrics=FeatureMetrics(CollectorRegistry())
            )
            records = [
                Record(settings.topics.clicks, 0, offset, key, value, time.time())
                for offset, (key, value) in enumerate(clicks(unique, users, 0, 50))
            ]
            try:
                first = await processor.process(records[:10])
                proxy.drop_next_reply()
                again = await processor.process(records)  # its reply is lost, then retried
            finally:
                await processor.stop()
            direct = settings.with_env(STREAMRANK_REDIS_URL=SecretStr(server.url))
            assert proxy.dropped == 1
            assert first.applied == 10
            # The run whose reply was lost applied the other 40; the retry found every marker.
            assert again.applied == 0 and again.duplicates == 50
            await applied_exactly_once(direct, users, unique, 50)
