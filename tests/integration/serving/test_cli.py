"""The scoring worker as its command (`streamrank worker scoring`), `streamrank rank`, the
/metrics endpoint, and RankClient's timeout and duplicate handling."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from schemas import RankResult
from scoring.client import RankClient, RankTimeout
from streamrank.errors import KafkaUnavailable
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from tests.integration.support.features import get_json
from tests.integration.support.scoring import item_ids, publish, train_tiny_artifact, wait_for
from workbench.devstack.services import free_port

pytestmark = pytest.mark.timeout(180)


def env_for(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")}
    env.update(
        STREAMRANK_KAFKA_BOOTSTRAP=settings.kafka.bootstrap,
        STREAMRANK_REDIS_URL=settings.redis.url.get_secret_value(),
        STREAMRANK_TOPIC_REQUESTS=settings.topics.requests,
        STREAMRANK_TOPIC_RESULTS=settings.topics.results,
        STREAMRANK_TOPIC_DEAD_LETTERS=settings.topics.dead_letters,
        STREAMRANK_SCORING_GROUP_ID=settings.scoring.group_id,
        STREAMRANK_SCORING_BUDGET_MS="10000",
    )
    return env


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    raise AssertionError(f"{prefix!r} not in /metrics")


def ready(port: int) -> bool:
    """The worker's /readyz answers 200 (False while it is not listening yet)."""
    try:
        return get_json(port, "/readyz")[0] == 200
    except OSError:
        return False


async def test_worker_command_rank_command_and_metrics(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path
) -> None:
    settings = make_settings(STREAMRANK_SCORING_GROUP_ID=f"cli-{unique}")
    await create_topics(settings)
    artifact = train_tiny_artifact(tmp_path, seed=5)
    redis = redis_client(settings.redis)
    version = await publish(redis, artifact)
    await redis.aclose()
    items = item_ids(artifact)[:3]
    env = env_for(settings)
    env["STREAMRANK_CANARY_SPLIT"] = f"{version}:1"  # leaves the shared active pointer alone
    port = free_port()
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workbench.cli", "worker", "scoring", "--metrics-port", str(port),
        env=env,
    )  # fmt: skip
    try:
        # as a client would: rank once the worker reports ready (its forward compiled and
        # checked, its partitions assigned), so the request is not expired while it starts
        await wait_for(
            lambda: asyncio.to_thread(ready, port), timeout_s=120, what="the worker ready"
        )
        rank = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "workbench.cli", "rank", "--user", "cli-user",
            "--items", ",".join(items), "--json", "--timeout", "60",
            env=env, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(rank.communicate(), 90)
        assert rank.returncode == 0
        reply = orjson.loads(out)
        assert reply["model_version"] == version and reply["items"] == items
        assert len(reply["scores"]) == 3 and not reply["degraded"]
        text = await asyncio.to_thread(
            lambda: (
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
                .read()
                .decode()
            )
        )
        assert (
            metric(
                text,
                "streamrank_scoring_requests_total",
                outcome="ok",
                reason="",
                topic=settings.topics.results,  # labels in the order /metrics prints them
            )
            == 1.0
        )
        assert (
            metric(
                text,
                "streamrank_scoring_model_info",
                encoding="int8",
                runtime="compiled",
                version=version,
            )
            == 1
        )
        assert metric(text, "streamrank_scoring_model_loaded") == 1.0
        assert metric(text, "streamrank_scoring_assigned_partitions") == settings.topics.partitions
        assert metric(text, "streamrank_scoring_rebalances_total") >= 1
        assert metric(text, "streamrank_scoring_commits_total", result="ok") >= 1
        lags = [
            line
            for line in text.splitlines()
            if line.startswith("streamrank_scoring_consumer_lag{")
        ]
        assert lags and all(line.endswith(" 0.0") for line in lags), lags
        # beside /metrics: liveness and readiness, with what each check saw
        status, alive = await asyncio.to_thread(get_json, port, "/healthz")
        assert status == 200 and alive["status"] == "ok", alive
        status, body = await asyncio.to_thread(get_json, port, "/readyz")
        assert status == 200 and body["status"] == "ready", body
        assert {name: check["ok"] for name, check in body["checks"].items()} == {
            "group": True,
            "model": True,
            "redis": True,
        }
        assert version in body["checks"]["model"]["detail"]
        assert metric(text, "streamrank_scoring_model_traffic_share", version=version) == 1.0
        assert metric(text, "streamrank_scoring_breaker_state") == 0.0
        assert metric(text, "streamrank_scoring_request_latency_seconds_count") == 1.0
        assert metric(text, "streamrank_scoring_stage_seconds_count", stage="forward") == 1.0
        assert "streamrank_embedding_cache_misses" in text
        assert metric(text, "streamrank_hot_pool_refresh_failures_total") == 0.0
        assert metric(text, "streamrank_hot_pool_refresh_seconds_count") >= 1
    finally:
        worker.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(worker.wait(), 30)
    assert code == 0


async def test_client_times_out_clearly_and_ignores_duplicate_replies(
    make_settings: Callable[..., Settings], unique: str
) -> None:
    settings = make_settings()
    await create_topics(settings)
    async with RankClient(settings=settings) as client:
        started = time.monotonic()
        with pytest.raises(RankTimeout, match="is a scoring worker running"):
            await client.rank("u1", ["a"], timeout=1.0, request_id=f"lost-{unique}")
        assert time.monotonic() - started < 5
        # a reply arriving late, and twice, for a request nobody waits for any more
        late = RankResult(f"lost-{unique}", "u1", ("a",), (0.5,), "v", served_at=1)
        producer = AIOKafkaProducer(**settings.kafka.client_kwargs())
        await producer.start()
        try:
            pending = asyncio.ensure_future(client.rank("u2", ["b"], timeout=10,
                                                        request_id=f"live-{unique}"))  # fmt: skip
            await asyncio.sleep(0.2)
            live = RankResult(f"live-{unique}", "u2", ("b",), (0.7,), "v", served_at=2)
            for result in (late, late, live, live):
                await producer.send_and_wait(settings.topics.results, result.to_json(),
                                             key=result.request_id.encode())  # fmt: skip
        finally:
            await producer.stop()
        got = await pending
        assert got.request_id == f"live-{unique}" and got.scores == (0.7,)
        await wait_for(lambda: client.duplicates >= 3, timeout_s=5, what="3 dropped duplicates")
        assert client.duplicates == 3  # two late + one repeated live reply, all dropped


async def test_client_whose_reply_reader_dies_fails_fast_instead_of_timing_out(
    make_settings: Callable[..., Settings], unique: str
) -> None:
    settings = make_settings()
    await create_topics(settings)
    async with RankClient(settings=settings) as client:
        waiting = asyncio.ensure_future(
            client.rank("u1", ["a"], timeout=30, request_id=f"w-{unique}")
        )
        await asyncio.sleep(0.2)
        assert client._consumer is not None
        await client._consumer.stop()  # the reply consumer fails under the reader
        started = time.monotonic()
        with pytest.raises(KafkaUnavailable, match="reply reader"):
            await waiting
        with pytest.raises(KafkaUnavailable, match="reply reader"):
            await client.rank("u2", ["b"], timeout=30)
        assert time.monotonic() - started < 5
