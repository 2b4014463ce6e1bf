"""A real Prometheus (the Debian package), on loopback in a temp dir, with
deploy/prometheus/prometheus.yml and alerts.yml, scrapes a running scoring and features
worker; its HTTP API answers `up`, the latency histogram and a histogram_quantile over it.
`streamrank top` reads the same endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from scoring.client import RankClient
from streamrank import keys
from streamrank.clock import now_ms
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streamrank.runtime.metrics_http import DEFAULT_PORTS
from streamrank.settings import Settings
from tests.conftest import require_tool
from tests.integration.support.features import click, poll, produce
from tests.integration.support.scoring import item_ids, publish
from workbench.devstack.processes import ChildProcess, start_child, start_worker
from workbench.devstack.services import free_port

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[3]


def prometheus_config(ports: dict[str, int], rules: Path) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with each job's Docker DNS discovery replaced by the
    loopback port of the worker started here (and a 1 s scrape interval)."""
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [str(rules)]
    jobs = []
    for job in config["scrape_configs"]:
        kind = job["job_name"].removeprefix("streamrank-")
        assert job.pop("dns_sd_configs")[0]["port"] == DEFAULT_PORTS[kind]
        if kind in ports:  # the jobs of processes this test does not start are left out
            job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[kind]}"]}]
            jobs.append(job)
    config["scrape_configs"] = jobs
    return config


def api(port: int, path: str) -> Any:
    """The ``data`` of one Prometheus HTTP API call."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}", timeout=5) as answer:
        body = orjson.loads(answer.read())
    assert body["status"] == "success", body
    return body["data"]


def query(port: int, expr: str) -> list[dict[str, Any]]:
    return list(api(port, f"query?query={urllib.parse.quote(expr)}")["result"])


async def current_version(settings: Settings) -> str:
    redis = redis_client(settings.redis)
    try:
        return (await redis.get(keys.active_model())).decode()
    finally:
        await redis.aclose()


@pytest.fixture
def prometheus_binary() -> str:
    return require_tool("prometheus", package="prometheus")


@pytest.fixture
def workers(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path
) -> Iterator[tuple[Settings, dict[str, int]]]:
    settings = make_settings(
        STREAMRANK_FEATURES_APP_ID=f"features-{unique}",
        STREAMRANK_SCORING_GROUP_ID=f"scoring-{unique}",
        STREAMRANK_SCORING_BUDGET_MS=10_000,
    )
    ports = {"features": free_port(), "scoring": free_port()}
    handles = [
        start_worker(kind, settings, log_path=tmp_path / f"{kind}.log", metrics_port=port)
        for kind, port in ports.items()
    ]
    try:
        for handle in handles:
            handle.wait_ready(120)
        yield settings, ports
    finally:
        for handle in handles:
            handle.stop()


async def test_prometheus_scrapes_both_workers_and_answers_queries(
    prometheus_binary: str,
    workers: tuple[Settings, dict[str, int]],
    tiny_artifacts: tuple[Path, Path],
    tmp_path: Path,
    unique: str,
) -> None:
    settings, ports = workers
    await create_topics(settings)
    redis = redis_client(settings.redis)
    try:
        await redis.set(keys.active_model(), await publish(redis, tiny_artifacts[0]))
    finally:
        await redis.aclose()
    items = item_ids(tiny_artifacts[0])[:5]
    async with RankClient(settings=settings) as client:
        # the version takes traffic once its forward is compiled: until then replies degrade
        async def served() -> bool:
            return not (await client.rank("warm-up", items, timeout=60)).degraded

        await poll(served, timeout_s=90, what="the worker serving the published version")
        # `streamrank top` over a window with traffic: its figures come from the same /metrics
        top = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "workbench.cli", "top", "--once", "--every", "5", "--json",
            "--features", f"http://127.0.0.1:{ports['features']}/metrics",
            "--scoring", f"http://127.0.0.1:{ports['scoring']}/metrics",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        # traffic until top is done (it starts in a second or two: a Python process)
        n = 0
        while top.returncode is None and n < 2000:
            await produce(settings, [(b"u1", click(f"e{n}-{unique}", "u1", items[0], now_ms()))])
            await client.rank(f"u{n}", items, timeout=60)
            n += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(top.wait(), 0.05)
        out, _ = await asyncio.wait_for(top.communicate(), 60)
    shown = orjson.loads(out)
    assert shown["up"] == {"features": 1, "scoring": 1}
    assert shown["scoring"]["requests_per_s"] > 0 and shown["scoring"]["p99_ms"] > 0
    assert shown["features"]["clicks_applied_per_s"] > 0
    assert (shown["scoring"]["stage_mean_ms"]["forward"] or 0) > 0, shown
    assert list(shown["scoring"]["models"]) == [await current_version(settings)]
    assert set(shown["lag"]) == {"features", "scoring"}

    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(prometheus_config(ports, ROOT / "deploy/prometheus/alerts.yml"))
    )
    port = free_port()
    prometheus: ChildProcess = start_child(
        [prometheus_binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        what="prometheus", log_path=tmp_path / "prometheus.log",
    )  # fmt: skip
    try:

        async def both_up() -> dict[str, float]:
            try:
                up = await asyncio.to_thread(query, port, "up")
            except OSError:
                return {}  # not listening yet
            values = {r["metric"]["job"]: float(r["value"][1]) for r in up}
            return (
                values if values == {"streamrank-features": 1.0, "streamrank-scoring": 1.0} else {}
            )

        await poll(both_up, timeout_s=60, what="both workers up in Prometheus", every_s=0.5)

        async def histogram() -> list[dict[str, Any]]:
            expr = "sum by (le) (streamrank_scoring_request_latency_seconds_bucket)"
            rows = await asyncio.to_thread(query, port, expr)
            inf = [r for r in rows if r["metric"]["le"] == "+Inf"]
            return rows if inf and float(inf[0]["value"][1]) >= 20 else []

        buckets = await poll(histogram, timeout_s=30, what="the latency histogram scraped")
        assert len(buckets) > 10  # every bucket of the histogram arrived
        await asyncio.sleep(2)  # a second scrape, so rate() has two points
        [p99] = await asyncio.to_thread(
            query,
            port,
            "histogram_quantile(0.99, sum by (le) "
            "(rate(streamrank_scoring_request_latency_seconds_bucket[1m])))",
        )
        # no new requests in the window: NaN, else a latency within the buckets
        value = p99["value"][1]
        assert value == "NaN" or 0 < float(value) <= 2.5
        [p99_total] = await asyncio.to_thread(
            query,
            port,
            "histogram_quantile(0.99, sum by (le) (streamrank_scoring_request_latency_seconds_bucket))",
        )
        assert 0 < float(p99_total["value"][1]) <= 2.5
        # the rules file loaded, and the workers' own series are there
        groups = (await asyncio.to_thread(api, port, "rules"))["groups"]
        loaded = {rule["name"]: rule["health"] for g in groups for rule in g["rules"]}
        assert "StreamrankWorkerDown" in loaded and set(loaded.values()) <= {"ok", "unknown"}
        assert await asyncio.to_thread(query, port, "streamrank_features_assigned_partitions")
        [loaded_model] = await asyncio.to_thread(query, port, "streamrank_scoring_model_loaded")
        assert float(loaded_model["value"][1]) == 1.0
    finally:
        prometheus.stop()
