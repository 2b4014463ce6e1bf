"""``bench streams``' drain phase: one features worker process drains the backlog, and with
``--ab-script`` the two write contracts drain the same backlog back to back.

:func:`drain_arm` starts a worker with the given settings, times it from its first to its last
applied event (its /metrics) and reads its CPU and the Redis servers' meanwhile. The A/B
(:func:`script_ab`) runs the previous contract (``markers``) and then the current one
(``id_sets``), each in a consumer group of its own reading the same topic from the start, with
the run's keys deleted between them so that both start from the same Redis state, and reports
each arm's figures beside the raw consumer's CPU per event and the issue's three ratios.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

from streamrank import keys
from streamrank.redis.client import redis_client, unlink_matching
from streamrank.settings import Settings
from workbench.bench.cpu import (
    host_busy_seconds,
    process_cpu_seconds,
    redis_usage,
    redis_usage_per_event,
)

CONTRACTS = {"previous": "markers", "current": "id_sets"}


def _applied(port: int) -> float:
    """Events the worker has processed: applied, plus any that a retried batch (after a
    timed-out reply) found already applied."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (
                "streamrank_features_events_applied_total",
                "streamrank_features_events_duplicate_total",
            ):
                total += float(sample.value)
    return total


async def measure_drain(pid: int, port: int, expected: int) -> dict[str, float]:
    """Poll the worker's applied counter until ``expected``; rate from first to last change."""
    first_t = first_n = None
    cpu0 = host0 = None
    last_n, last_t = 0.0, time.perf_counter()
    deadline = time.monotonic() + 900
    bar = tqdm(total=expected, desc="worker", unit="ev", mininterval=1.0)
    while time.monotonic() < deadline:
        n = await asyncio.to_thread(_applied, port)
        now = time.perf_counter()
        if n > 0 and first_t is None:
            first_t, first_n = now, n
            cpu0, host0 = process_cpu_seconds(pid), host_busy_seconds()
        bar.update(int(n - last_n))
        last_n, last_t = n, now
        if n >= expected:
            break
        await asyncio.sleep(0.1)
    bar.close()
    if first_t is None or last_n < expected:
        raise RuntimeError(f"worker applied {last_n} of {expected} events")
    cpu = process_cpu_seconds(pid) - (cpu0 or 0.0)
    host = host_busy_seconds() - (host0 or 0.0)
    applied = last_n - (first_n or 0.0)
    elapsed = max(last_t - first_t, 1e-9)
    return {
        "events_per_s": applied / elapsed,
        "worker_cpu_us_per_event": cpu / max(applied, 1) * 1e6,
        "host_busy_cores": host / elapsed,
    }


async def drain_arm(
    settings: Settings, *, expected: int, log_path: Path, redis: Any
) -> tuple[dict[str, Any], Any]:
    """Start a features worker, measure its drain of ``expected`` events (its CPU, the Redis
    servers', the host's); the figures and the still running worker (the caller stops it)."""
    from workbench.devstack.processes import start_worker

    before = await redis_usage(redis)
    worker = start_worker("features", settings, log_path=log_path, metrics_port=None)
    try:
        await asyncio.to_thread(worker.wait_ready, 120)
        drain = await measure_drain(worker.pid, settings.observability.metrics_port or 0, expected)
    except BaseException:
        worker.stop()
        raise
    figures = {**drain, **redis_usage_per_event(before, await redis_usage(redis), expected)}
    return figures, worker


async def cleanup(settings: Settings, run: str) -> int:
    """Delete the run's keys (every master of a cluster is scanned), its item counts and its
    ids in the slot groups' event-id sets."""
    client = redis_client(settings.redis, timeout_s=10)
    deleted = 0
    try:
        for pattern in (
            keys.user_keys_pattern(f"{run}-*"),
            keys.item_keys_pattern(f"seen:{run}-"),
        ):
            deleted += await unlink_matching(client, pattern, batch=5000)
        async for key in client.scan_iter(match=keys.item_keys_pattern("cnt")):
            fields = [f async for f, _ in client.hscan_iter(key, match=f"{run}-*")]
            if fields:
                await client.hdel(key, *fields)
        async for key in client.scan_iter(match=keys.event_ids_pattern()):
            members = [m async for m in client.sscan_iter(key, match=f"{run}-*", count=5000)]
            for start in range(0, len(members), 5000):
                await client.srem(key, *members[start : start + 5000])
    finally:
        await client.aclose()
    return deleted


def _rounded(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in figures.items()}


async def script_ab(
    settings: Settings, run: str, *, expected: int, work_dir: Path, raw_cpu_us: float
) -> dict[str, Any]:
    """Both write contracts drain the same backlog, the previous first, each from a fresh
    state of the run's keys; each arm's figures and the ratios the goals are judged by."""
    arms: dict[str, dict[str, Any]] = {}
    redis = redis_client(settings.redis, timeout_s=10)
    try:
        for arm, contract in CONTRACTS.items():
            arm_settings = settings.with_env(
                STREAMRANK_FEATURES_WRITE_CONTRACT=contract,
                STREAMRANK_FEATURES_APP_ID=f"{run}-features-{contract}",
            )
            figures, worker = await drain_arm(
                arm_settings,
                expected=expected,
                log_path=work_dir / f"{run}-{contract}.log",
                redis=redis,
            )
            worker.stop()
            await cleanup(settings, run)
            arms[arm] = {"write_contract": contract, **_rounded(figures)}
    finally:
        await redis.aclose()
    return {**arms, **ab_ratios(arms["previous"], arms["current"], raw_cpu_us)}


def ab_ratios(
    previous: dict[str, Any], current: dict[str, Any], raw_cpu_us: float
) -> dict[str, Any]:
    """The goals' ratios: Redis CPU current / previous (<= 0.5), worker + Redis CPU / the raw
    consumer's CPU per event (<= 3), events/s current / previous (>= 1.5)."""
    redis_ratio = current["redis_cpu_us_per_event"] / max(previous["redis_cpu_us_per_event"], 1e-9)
    total = current["worker_cpu_us_per_event"] + current["redis_cpu_us_per_event"]
    previous_total = previous["worker_cpu_us_per_event"] + previous["redis_cpu_us_per_event"]
    speed = current["events_per_s"] / max(previous["events_per_s"], 1e-9)
    return {
        "raw_consume_cpu_us_per_event": round(raw_cpu_us, 1),
        "redis_cpu_current_vs_previous": round(redis_ratio, 3),
        "cpu_current_vs_raw": round(total / max(raw_cpu_us, 1e-9), 2),
        "cpu_previous_vs_raw": round(previous_total / max(raw_cpu_us, 1e-9), 2),
        "events_per_s_current_vs_previous": round(speed, 3),
        "goal_redis_cpu_half": redis_ratio <= 0.5,
        "goal_cpu_3x_raw": total <= 3 * raw_cpu_us,
        "goal_events_per_s_1_5x": speed >= 1.5,
    }
