"""The features worker process end to end: real broker, real Redis, real Faust consumer group."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from streams.reader import FeatureReader
from tests.integration.support.features import (
    click,
    committed_offsets,
    counted_at,
    get_json,
    metric,
    poll,
    produce,
    read_dead_letters,
    scrape,
    sequence_members,
)
from workbench.devstack.processes import start_worker
from workbench.devstack.services import free_port


async def topic_ends(settings: Settings) -> dict[int, int]:
    """Next offset of each partition, found by reading the topic (offsets are contiguous)."""
    consumer = AIOKafkaConsumer(
        settings.topics.clicks,
        **settings.kafka.client_kwargs(),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    ends: dict[int, int] = {}
    try:
        idle = 0
        while idle < 3:
            batch = await consumer.getmany(timeout_ms=300)
            idle = 0 if batch else idle + 1
            for tp, records in batch.items():
                ends[tp.partition] = records[-1].offset + 1
    finally:
        await consumer.stop()
    return ends


def watch_lag(settings: Settings, refreshes: int) -> list[dict]:  # type: ignore[type-arg]
    """`streamrank lag features --watch 0.5 --json`: that many refreshes, then Ctrl-C."""
    watch = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "lag", "features", "--watch", "0.5", "--json"],
        stdout=subprocess.PIPE, env={**os.environ, **settings.as_env()}, text=True,
    )  # fmt: skip
    assert watch.stdout is not None
    try:
        return [orjson.loads(watch.stdout.readline()) for _ in range(refreshes)]
    finally:
        watch.send_signal(signal.SIGINT)
        assert watch.wait(30) == 0


async def assert_operable(settings: Settings, port: int) -> None:
    """Beside /metrics: liveness, readiness, the group metrics, and `streamrank lag` naming
    this worker as the owner of every partition."""
    status, alive = await asyncio.to_thread(get_json, port, "/healthz")
    assert status == 200 and alive["status"] == "ok", alive
    status, ready = await asyncio.to_thread(get_json, port, "/readyz")
    assert status == 200, ready
    assert {name: check["ok"] for name, check in ready["checks"].items()} == {
        "group": True,
        "redis": True,
    }
    samples = await asyncio.to_thread(scrape, port)
    # the partitions of the clicks and the items topics
    assigned = metric(samples, "streamrank_features_assigned_partitions")
    assert assigned == 2 * settings.topics.partitions
    assert metric(samples, "streamrank_features_rebalances_total") >= 1
    assert metric(samples, "streamrank_features_commits_total", result="ok") >= 1
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "workbench.cli", "lag", "features", "--json"],
        capture_output=True,
        env={**os.environ, **settings.as_env()},
        check=True,
    )
    info = orjson.loads(shown.stdout)["features"]
    assert info["total_lag"] == 0 and info["owners_from"] in ("registry", "broker"), info
    [member] = info["members"]
    assert member["partitions"] == list(range(settings.topics.partitions))
    assert member["member"].startswith("streamrank-features-"), member
    assert {row["owner"] for row in info["partitions"]} == {member["member"]}
    text = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "workbench.cli", "lag", "features"],
        capture_output=True,
        text=True,
        env={**os.environ, **settings.as_env(), "COLUMNS": "200"},
        check=True,
    )
    assert f"owners from {info['owners_from']}" in text.stdout, text.stdout
    assert member["member"] in text.stdout
    # --watch refreshes until Ctrl-C
    refreshes = await asyncio.to_thread(watch_lag, settings, 3)
    assert all(r["features"]["members"][0]["member"] == member["member"] for r in refreshes)


# On a cluster each batch is split per hash slot and applied by one script call per slot; the
# agent path hands records to the same batch processor, so the cluster pass runs only "batch".
@pytest.mark.parametrize("path", [pytest.param("batch", marks=pytest.mark.cluster), "agent"])
async def test_worker_applies_forwards_and_dead_letters(
    make_settings, unique, tmp_path: Path, path: str
) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    settings = make_settings(
        STREAMRANK_FEATURES_APP_ID=f"features-{unique}",
        STREAMRANK_SEQUENCE_LENGTH=1000,
        STREAMRANK_METRICS_PORT=port,
        STREAMRANK_FEATURES_PATH=path,
    )
    worker = start_worker("features", settings, log_path=tmp_path / "worker.log", metrics_port=None)
    try:
        await asyncio.to_thread(worker.wait_ready, 60)
        now = int(time.time() * 1000)
        users = [f"u{i}-{unique}" for i in range(10)]
        keyed = [
            (
                users[i % 10].encode(),
                click(f"{unique}-{i:05d}", users[i % 10], f"i{i % 7}", now - i),
            )
            for i in range(300)
        ]
        unkeyed = [
            (None, click(f"{unique}-u{i:03d}", users[i % 10], "i-unkeyed", now)) for i in range(20)
        ]
        redelivered = keyed[:10]
        bad = [
            (b"k", b"\xff\xfe not json"),
            (b"k", orjson.dumps({"event_id": "x", "user_id": "u"})),
            (b"k", orjson.dumps({"event_id": "x", "user_id": "u", "item_id": 5, "ts": now})),
            (b"k", click("x2", "u", "i", now - 30 * 86400 * 1000)),
            (b"k", b'{"pad": "' + b"x" * 70_000 + b'"}'),
        ]
        await produce(settings, keyed + unkeyed + bad + redelivered)

        async def all_applied() -> bool:
            members = await sequence_members(settings, users)
            return sum(len(m) for m in members.values()) == 320

        await poll(all_applied, timeout_s=30, what="all 320 clicks in the sequences")
        members = await sequence_members(settings, users)
        flat = [e for m in members.values() for e in m]
        assert len(flat) == len(set(flat)) == 320  # redeliveries not inserted twice
        client = redis_client(settings.redis)
        counters = await FeatureReader(redis=client, features=settings.features).get_counters(
            user_ids=users, at_ms=counted_at(settings, now, "1h")
        )
        await client.aclose()
        assert sum(c["clicks_1h"] for c in counters["users"].values()) == 320  # none counted twice

        if path == "batch":  # the CLI view of one user
            shown = await asyncio.to_thread(
                subprocess.run,
                [
                    sys.executable,
                    "-m",
                    "workbench.cli",
                    "features",
                    "--user",
                    users[3],
                    "--json",
                    "--as-of",
                    str(counted_at(settings, now, "24h")),
                ],
                capture_output=True,
                env={**os.environ, **settings.as_env()},
                check=True,
            )
            view = orjson.loads(shown.stdout)
            assert view["user_id"] == users[3]
            assert [e["event_id"] for e in view["sequence"]] == members[users[3]]
            assert set(view["sequence"][0]) == {"item_id", "category", "ts", "event_id", "action"}
            assert view["sequence"][0]["action"] == "click"  # the contract's default
            assert view["counters"]["clicks_24h"] == 32  # 30 keyed + 2 unkeyed
            assert view["counters"]["categories_24h"] == {"drama": 32}

        letters = await read_dead_letters(settings, expected=5)
        reasons = sorted(letter.error.split(":")[0] for letter in letters)
        assert reasons == sorted(
            ["not_json", "missing_field", "bad_type", "ts_out_of_range", "too_large"]
        )
        by_reason = {letter.error.split(":")[0]: letter for letter in letters}
        assert by_reason["not_json"].original_bytes() == b"\xff\xfe not json"
        assert by_reason["not_json"].payload_encoding == "base64"
        assert by_reason["not_json"].source_topic == settings.topics.clicks
        assert by_reason["not_json"].offset >= 0

        samples = await asyncio.to_thread(scrape, port)
        assert metric(samples, "streamrank_features_events_applied_total") == 320
        assert metric(samples, "streamrank_features_events_forwarded_total") == 20
        assert metric(samples, "streamrank_features_events_duplicate_total") == 10
        assert metric(samples, "streamrank_features_dead_letters_total", reason="not_json") == 1
        assert metric(samples, "streamrank_features_dead_letters_total", reason="too_large") == 1
        if path == "batch":
            # Everything produced gets processed: then no partition is behind its high watermark.
            async def caught_up() -> bool:
                lags = [
                    value
                    for (name, _labels), value in (await asyncio.to_thread(scrape, port)).items()
                    if name == "streamrank_features_consumer_lag"
                ]
                return bool(lags) and set(lags) == {0.0}

            await poll(caught_up, timeout_s=15, what="consumer lag 0 on every partition")

        ends = await topic_ends(settings)
        # Every produced record plus the 20 keyed copies of the unkeyed ones.
        assert sum(ends.values()) == 300 + 20 + 5 + 10 + 20

        async def all_committed() -> bool:
            return await committed_offsets(settings) == ends

        await poll(all_committed, timeout_s=15, what="offsets committed up to the end")
        if path == "batch":
            await assert_operable(settings, port)
    finally:
        code = worker.stop()
    assert code == 0 or not worker.alive()


async def test_a_fetch_wait_the_broker_starves_is_raised_until_clicks_apply(
    make_settings, unique, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # The embedded broker answers a fetch held 0 ms empty however many records wait: the
    # starvation a loaded broker shows at the default 10 ms.
    port = free_port()
    settings = make_settings(
        STREAMRANK_FEATURES_APP_ID=f"features-{unique}",
        STREAMRANK_FEATURES_FETCH_MAX_WAIT_MS=0,
    )
    worker = start_worker("features", settings, log_path=tmp_path / "worker.log", metrics_port=port)
    try:
        await asyncio.to_thread(worker.wait_ready, 60)
        now = int(time.time() * 1000)
        users = [f"u{i}-{unique}" for i in range(5)]
        clicks = [
            (users[i % 5].encode(), click(f"{unique}-{i:04d}", users[i % 5], f"i{i}", now - i))
            for i in range(200)
        ]
        await produce(settings, clicks)

        async def all_applied() -> bool:
            members = await sequence_members(settings, users)
            return sum(len(m) for m in members.values()) == 200

        await poll(all_applied, timeout_s=30, what="all 200 clicks in the sequences")
        samples = await asyncio.to_thread(scrape, port)
        assert metric(samples, "streamrank_features_fetch_wait_seconds") > 0
    finally:
        worker.stop()
    log = (tmp_path / "worker.log").read_text()
    assert "fetch wait raised from 0 to" in log, log
