"""Secrets never leave the process: a Redis password (AUTH for real: requirepass on the
embedded redis-server) and a SASL password are in use, and every output of the run is grepped
for them: worker logs, `streamrank settings`, error messages and /metrics.

The embedded Redis binary has no TLS, so TLS is not exercised here; docs/reliability.md says
exactly how it is configured (rediss:// and STREAMRANK_REDIS_SSL_CA_CERTS).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from scoring.client import RankClient
from streamrank import keys
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from tests.integration.support.features import click, produce
from tests.integration.support.scoring import item_ids, publish
from workbench.devstack.processes import start_worker, worker_env
from workbench.devstack.servers import private_redis
from workbench.devstack.services import free_port

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

REDIS_PASSWORD = "r3dis-S3cret-7f1c"
SASL_PASSWORD = "sasl-S3cret-90ab"
SECRETS = (REDIS_PASSWORD, SASL_PASSWORD)


def assert_clean(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a secret appears in {where}:\n{text[-2000:]}"


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def metrics_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


async def test_no_secret_in_logs_settings_errors_or_metrics(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    with private_redis(tmp_path / "redis", password=REDIS_PASSWORD) as server:
        assert REDIS_PASSWORD in server.url
        settings = make_settings(
            STREAMRANK_REDIS_URL=server.url, STREAMRANK_FEATURES_APP_ID=f"features-{unique}",
            STREAMRANK_SCORING_GROUP_ID=f"scoring-{unique}", STREAMRANK_SCORING_BUDGET_MS=10_000,
            # In every process's settings; the embedded broker has no SASL, so the handshake
            # itself (refused) runs in the second half of the test.
            STREAMRANK_KAFKA_SASL_USERNAME="svc", STREAMRANK_KAFKA_SASL_PASSWORD=SASL_PASSWORD,
        )  # fmt: skip
        await create_topics(settings)
        client = redis_client(settings.redis)
        try:
            await client.set(keys.active_model(), await publish(client, tiny_artifacts[0]))
        finally:
            await client.aclose()

        # The workers really authenticate to Redis: a click is applied, a request answered.
        ports = {"features": free_port(), "scoring": free_port()}
        features, scoring = (
            start_worker(kind, settings, log_path=tmp_path / f"{kind}.log", metrics_port=port)
            for kind, port in ports.items()
        )
        try:
            features.wait_ready(120)
            scoring.wait_ready(120)
            now = int(time.time() * 1000)
            await produce(settings, [(b"u1", click(f"{unique}-e1", "u1", "i1", now))])
            async with RankClient(settings=settings) as rank:
                result = await rank.rank("u1", item_ids(tiny_artifacts[0])[:3], timeout=60)
            assert not result.degraded
            for worker, port in zip((features, scoring), ports.values(), strict=True):
                text = await asyncio.to_thread(metrics_text, port)
                assert_clean(text, f"{worker.what} /metrics")
                assert "streamrank_" in text  # the endpoint really served our samples
        finally:
            features.stop()
            scoring.stop()
        assert_clean(features.log_text(), "the features worker's log")
        assert_clean(scoring.log_text(), "the scoring worker's log")

        env = worker_env(settings)
        shown = cli(["settings"], env)
        assert shown.returncode == 0, shown.stderr
        printed = json.loads(shown.stdout)
        assert printed["redis"]["url"] == "**********"
        assert printed["kafka"]["sasl_password"] == "**********"
        assert_clean(shown.stdout + shown.stderr, "`streamrank settings`")

        # Errors: a wrong Redis password, and a SASL handshake the broker refuses.
        wrong = dict(
            env,
            STREAMRANK_REDIS_URL=server.url.replace(
                REDIS_PASSWORD, "wr0ng-" + REDIS_PASSWORD[::-1]
            ),
        )
        refused = cli(["activate", "din-20990101-abcdef"], wrong)
        assert refused.returncode == 1
        assert_clean(refused.stdout + refused.stderr, "a Redis AUTH error")
        over_sasl = settings.with_env(
            STREAMRANK_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT", STREAMRANK_KAFKA_SASL_MECHANISM="PLAIN",
            STREAMRANK_KAFKA_START_TIMEOUT_S=3.0,
        )  # fmt: skip
        failed = cli(["topics", "create"], worker_env(over_sasl))
        assert failed.returncode == 1
        assert_clean(failed.stdout + failed.stderr, "a SASL error")
        for kind in ("features", "scoring"):
            worker = start_worker(kind, over_sasl, log_path=tmp_path / f"sasl-{kind}.log")
            worker.process.wait(120)
            assert worker.process.returncode == 1, worker.log_text()[-3000:]
            assert "did not answer within 3s" in worker.log_text(), worker.log_text()[-3000:]
            assert_clean(worker.log_text(), f"the log of a {kind} worker refused by the broker")
