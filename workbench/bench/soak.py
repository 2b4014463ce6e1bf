"""``streamrank bench soak --minutes M --json``: sustained load, minute by minute.

On a private embedded stack (its Redis memory is the engine's alone) with one features and one
scoring worker (processes):

1. the maximum of each path, measured in this run: the scoring worker's reply rate with a
   backlog of requests queued at once, and the features worker's drain rate of a backlog of
   clicks (which also fills every user's sequence);
2. the combined capacity (:mod:`workbench.bench.soak_capacity`): both loads at once, in the
   proportions of the two maxima, at rising levels until the workers fall behind or the p99
   leaves the ranking budget;
3. clicks and requests at ``--fraction`` (0.6) of the combined capacity for ``--minutes``,
   from the load driver (``streamrank bench drive``, a process of its own, recording every
   reply);
4. per window (``--window-s``, 60): p50/p99 send-to-reply latency, RSS and open file
   descriptors of each worker, Redis ``used_memory`` and the consumer lag of both groups;
5. afterwards: every request answered, lag back to 0.

``--floor``: the broker's true floor beside the workers for the same minutes
(:mod:`workbench.bench.soak_floor`), its p50/p99 in each window next to ours.

Goals: p99 of the last window within 20% of the first window after the warm-up (window 0);
RSS growth under 10% after the warm-up; Redis memory flat (within 10%) once the dedupe TTL
(``--ttl-s``, shortened for the run) has turned over; replies == requests; lag back to 0.
Counter buckets are an hour long for the run, so no new bucket keys appear within the hour.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from pydantic import SecretStr

from streamrank import clock, keys
from streamrank.kafka import clients as kafka
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streamrank.settings import CascadeSettings, Settings
from workbench.bench.drive import Run, load_run
from workbench.bench.loadgen import Driver, make_requests
from workbench.bench.scoring import publish_synthetic
from workbench.bench.soak_capacity import Probe, combined_capacity
from workbench.bench.soak_floor import floor_summary, floor_window, start_floor, start_floor_driver
from workbench.devstack.processes import ChildProcess, WorkerProcess, start_command, start_worker
from workbench.devstack.services import free_port
from workbench.devstack.stack import EmbeddedStack
from workbench.lag import group_lag

logger = logging.getLogger(__name__)

GOAL_P99_RATIO = 1.2
GOAL_RSS_GROWTH = 0.10
GOAL_REDIS_FLAT = 0.10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to sustain load")
    parser.add_argument("--window-s", type=float, default=60.0, help="seconds per reported window")
    parser.add_argument(
        "--fraction", type=float, default=0.6, help="share of the combined capacity to soak at"
    )
    parser.add_argument(
        "--probe-s", type=float, default=30.0, help="seconds per combined-capacity level"
    )
    parser.add_argument(
        "--p99-budget-ms",
        type=float,
        default=CascadeSettings().budget_ms,
        help="p99 a combined-capacity level must keep (default: the cascade's default deadline, "
        "a whole request's ranking budget)",
    )
    parser.add_argument("--click-rate", type=float, help="clicks/s (default: fraction x max)")
    parser.add_argument("--request-rate", type=float, help="requests/s (default: fraction x max)")
    parser.add_argument("--ttl-s", type=int, default=60, help="dedupe TTL for the run, seconds")
    parser.add_argument("--users", type=int, default=200, help="distinct users")
    parser.add_argument("--items", type=int, default=20_000, help="item table size")
    parser.add_argument("--candidates", type=int, default=50, help="candidates per request")
    parser.add_argument(
        "--backlog-clicks",
        type=int,
        default=30_000,
        help="for the features max; at least 2 x users x sequence_length, so that the "
        "sequences are full when the scoring max is measured",
    )
    parser.add_argument("--backlog-requests", type=int, default=2_000, help="for the scoring max")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run the broker's true floor (a minimal aiokafka echo) on topics of its own, "
        "driven at the soak's request rate: its p50/p99 per window beside ours",
    )
    parser.add_argument(
        "--records",
        type=Path,
        metavar="DIR",
        help="keep the run's records (every message and reply) and worker logs in DIR "
        "(default: a temporary folder, removed after the run)",
    )


# --- process and Redis probes -----------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def redis_memory_mb(redis: Any) -> float:
    return round(int((await redis.info("memory"))["used_memory"]) / 2**20, 2)


async def lags(settings: Settings) -> dict[str, int]:
    """Records behind, per group. A partition ahead of its end offset counts 0: the embedded
    broker (Tansu) reports an end offset short of the last record of a multi-record batch,
    so a group that has committed everything shows a negative lag there."""
    features = await group_lag(settings, settings.features.app_id, settings.topics.clicks)
    scoring = await group_lag(settings, settings.scoring.group_id, settings.topics.requests)
    return {"features": sum(max(0, r.lag) for r in features),
            "scoring": sum(max(0, r.lag) for r in scoring)}  # fmt: skip


# --- the maxima -------------------------------------------------------------------------------


async def features_max(settings: Settings, args: argparse.Namespace, items: int) -> float:
    """Clicks/s the features worker drains from a backlog (its lag to 0). The backlog fills
    every user's sequence: with half-full ones the scoring max would overstate what the worker
    sustains once the soak's clicks fill them, and the soak would run overloaded."""
    # Users are drawn at random: twice the sequence length each, on average, fills nearly all.
    backlog = max(args.backlog_clicks, 2 * args.users * settings.features.sequence_length)
    producer = kafka.producer(settings.kafka, acks=1, linger_ms=5)
    await producer.start()
    rng = np.random.default_rng(args.seed)
    now = clock.now_ms()
    try:
        for n in range(backlog):
            user = f"u{int(rng.integers(args.users))}"
            value = orjson.dumps({"event_id": f"backlog-{n}", "user_id": user,
                                  "item_id": f"i{int(rng.integers(items))}", "ts": now})  # fmt: skip
            await producer.send(settings.topics.clicks, value, key=user.encode())
        await producer.flush()
    finally:
        await producer.stop()
    started = time.perf_counter()
    while True:  # the group's committed offsets tell when the backlog is applied
        if not (await lags(settings))["features"]:
            break
        await asyncio.sleep(0.2)
    return backlog / (time.perf_counter() - started)


async def scoring_max(settings: Settings, args: argparse.Namespace) -> float:
    """Replies/s of the scoring worker with a backlog of requests queued at once."""
    requests = make_requests(n=args.backlog_requests + 50, users=args.users, n_items=args.items,
                             candidates=args.candidates, zipf_a=1.1, seed=args.seed)  # fmt: skip
    async with Driver(settings=settings, requests_topic=settings.topics.requests,
                      results_topic=settings.topics.results) as driver:  # fmt: skip
        await driver.open_loop(requests[:50], rate=50.0, drain_s=60.0)  # warm
        rate, _stats = await driver.saturate(requests[50:], drain_s=180.0)
    return rate


# --- the run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def private_stack(run_dir: Path) -> Iterator[EmbeddedStack]:
    stack = EmbeddedStack(run_dir=run_dir, kafka_port=free_port(), redis_port=free_port())
    stack.up(timeout_s=60)
    try:
        yield stack
    finally:
        stack.down()


def soak_settings(
    base: Settings, stack: EmbeddedStack, args: argparse.Namespace, run_dir: Path
) -> Settings:
    tag = uuid.uuid4().hex[:6]
    return base.with_env(
        STREAMRANK_KAFKA_BOOTSTRAP=stack.bootstrap, STREAMRANK_REDIS_URL=SecretStr(stack.redis_url),
        STREAMRANK_RUN_DIR=run_dir, STREAMRANK_METRICS_PORT=0, STREAMRANK_LOG_LEVEL="WARNING",
        STREAMRANK_FEATURES_APP_ID=f"soak-features-{tag}", STREAMRANK_SCORING_GROUP_ID=f"soak-scoring-{tag}",
        STREAMRANK_DEDUPE_TTL_S=args.ttl_s, STREAMRANK_COUNTER_BUCKET_S=3600, STREAMRANK_COUNTER_COARSE_BUCKET_S=3600,
        STREAMRANK_SCORING_BUDGET_MS=5000,  # latency is measured, not turned into "expired" replies
    )  # fmt: skip


def window_of(run: Run, start_ms: int, end_ms: int) -> dict[str, Any]:
    got = run.first_replies()
    sent = [r for r in run.requests if start_ms <= r["sent_ms"] < end_ms]
    degraded = sum(1 for r in sent if r["request_id"] in got and got[r["request_id"]]["degraded"])
    out: dict[str, Any] = {"requests": len(sent), "degraded": degraded,
                           "clicks": sum(1 for c in run.clicks if start_ms <= c["ts"] < end_ms),
                           **run.percentiles_ms(start_ms, end_ms)}  # fmt: skip
    return out


def windows_table(
    args: argparse.Namespace, started_ms: int, samples: list[dict[str, Any]], run: Run,
    floor_run: Run | None,
) -> list[dict[str, Any]]:  # fmt: skip
    """One row per window: its latencies (and the floor's), then its samples."""
    rows = []
    for k, sample in enumerate(samples):
        lo = started_ms + int(k * args.window_s * 1000)
        hi = lo + int(args.window_s * 1000)
        floor_figures = floor_window(floor_run, lo, hi) if floor_run is not None else {}
        rows.append({"minute": round(k * args.window_s / 60, 2),
                     **window_of(run, lo, hi), **floor_figures, **sample})  # fmt: skip
    return rows


async def wait_for_driver(driver: ChildProcess, what: str) -> None:
    """Until a load driver exits; its log's end in the error when it failed."""
    await asyncio.to_thread(driver.process.wait)
    if driver.process.returncode != 0:
        raise RuntimeError(f"{what} failed: {driver.log_text()[-2000:]}")


async def sample_windows(
    args: argparse.Namespace, s: Settings, seconds: float, driver: ChildProcess,
    workers: dict[str, WorkerProcess], redis: Any,
) -> list[dict[str, Any]]:  # fmt: skip
    """At the end of each window of the run: each worker's RSS and descriptors, Redis memory,
    both groups' lag."""
    samples = []
    t0 = time.monotonic()
    for k in range(max(1, round(seconds / args.window_s))):
        await asyncio.sleep(max(0.0, t0 + (k + 1) * args.window_s - time.monotonic()))
        if not driver.alive() and driver.process.returncode != 0:
            raise RuntimeError(f"the load driver failed: {driver.log_text()[-2000:]}")
        samples.append({
            "rss_mb": {kind: rss_mb(w.pid) for kind, w in workers.items()},
            "open_fds": {kind: open_fds(w.pid) for kind, w in workers.items()},
            "redis_used_memory_mb": await redis_memory_mb(redis),
            "lag": await lags(s),
        })  # fmt: skip
    return samples


async def _soak(
    args: argparse.Namespace, base: Settings, stack: EmbeddedStack, run_dir: Path
) -> dict[str, Any]:
    s = soak_settings(base, stack, args, run_dir)
    await create_topics(s)
    redis = redis_client(s.redis, timeout_s=30)
    children: list[ChildProcess] = []
    try:
        version = f"soak-din-{uuid.uuid4().hex[:6]}"
        await publish_synthetic(redis, n_items=args.items, seed=args.seed, version=version,
                                workdir=run_dir / "model")  # fmt: skip
        await redis.set(keys.active_model(), version)
        workers: dict[str, WorkerProcess] = {}
        for kind in ("features", "scoring"):
            workers[kind] = start_worker(kind, s, log_path=run_dir / f"{kind}.log")
            children.append(workers[kind])
        if args.floor:
            floor, floor_child = await start_floor(s, run_dir)
            children.append(floor_child)
        for worker in workers.values():
            await asyncio.to_thread(worker.wait_ready, 180)
        logger.info("measuring the maxima (backlogs of %d clicks, %d requests)",
                    args.backlog_clicks, args.backlog_requests)  # fmt: skip
        max_clicks = await features_max(s, args, args.items)
        max_requests = await scoring_max(s, args)
        items = run_dir / "items.txt"
        items.write_text("".join(f"i{n}\n" for n in range(args.items)))
        probe = Probe(settings=s, items_file=items, run_dir=run_dir, users=args.users,
                      candidates=args.candidates, seconds=args.probe_s,
                      p99_budget_ms=args.p99_budget_ms)  # fmt: skip
        click_rate, request_rate, combined = await soak_rates(
            probe, args, max_clicks=max_clicks, max_requests=max_requests
        )
        seconds = args.minutes * 60
        out = run_dir / "run"
        shared = ["--users", str(args.users), "--candidates", str(args.candidates),
                  "--item-file", str(items), "--drain-s", "120"]  # fmt: skip
        driver = start_command(
            ["bench", "drive", "--json", "--records", str(out), "--seconds", str(seconds),
             "--click-rate", str(click_rate), "--request-rate", str(request_rate), *shared],
            s, log_path=run_dir / "driver.log", what="load driver",
        )  # fmt: skip
        children.append(driver)
        if args.floor:
            floor_driver = start_floor_driver(floor, run_dir, seconds=seconds,
                                              request_rate=request_rate, driver_args=shared)  # fmt: skip
            children.append(floor_driver)
        logger.info("soaking %.1f min at %.0f clicks/s and %.0f requests/s",
                    args.minutes, click_rate, request_rate)  # fmt: skip
        started_ms = clock.now_ms()
        samples = await sample_windows(args, s, seconds, driver, workers, redis)
        await wait_for_driver(driver, "the load driver")
        if args.floor:
            await wait_for_driver(floor_driver, "the floor's load driver")
        deadline = time.monotonic() + 120
        final_lag = await lags(s)
        while any(final_lag.values()) and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            final_lag = await lags(s)
        alive = {kind: w.alive() for kind, w in workers.items()}
        run = load_run(out)
        floor_run = load_run(run_dir / "floor-run") if args.floor else None
    finally:
        for child in reversed(children):
            child.stop(timeout_s=20)
        await redis.aclose()
    per_minute = windows_table(args, started_ms, samples, run, floor_run)
    figures = report(args, per_minute, run, final_lag, alive, max_clicks, max_requests,
                     click_rate, request_rate)  # fmt: skip
    if floor_run is not None:
        figures["floor"] = floor_summary(per_minute, floor_run)
    return {**figures, "combined_capacity": combined}


async def soak_rates(
    probe: Probe, args: argparse.Namespace, *, max_clicks: float, max_requests: float
) -> tuple[float, float, dict[str, Any]]:
    """The soak's click and request rates: ``--fraction`` of the combined capacity (each maximum
    was measured with the other path idle, and both share the cores), unless given."""
    combined = await combined_capacity(
        probe, lags, max_clicks=max_clicks, max_requests=max_requests
    )
    click_rate = args.click_rate or round(args.fraction * combined["clicks_per_s"], 1)
    request_rate = args.request_rate or round(args.fraction * combined["requests_per_s"], 1)
    if not (click_rate and request_rate):
        raise RuntimeError(f"no combined load kept up: {combined['probes']}")
    return click_rate, request_rate, combined


def report(args: argparse.Namespace, per_minute: list[dict[str, Any]], run: Run,
           final_lag: dict[str, int], alive: dict[str, bool], max_clicks: float,
           max_requests: float, click_rate: float, request_rate: float) -> dict[str, Any]:  # fmt: skip
    """The JSON of the run, with one entry in ``goals`` per goal of the module doc."""
    warm = per_minute[1] if len(per_minute) > 1 else per_minute[0]
    last = per_minute[-1]
    p99_first, p99_last = warm.get("p99_ms"), last.get("p99_ms")
    growth = {k: round(last["rss_mb"][k] / warm["rss_mb"][k] - 1, 3) for k in warm["rss_mb"]}
    # Memory once the dedupe TTL has turned over (markers written before it have expired).
    turned = next((m for m in per_minute if m["minute"] * 60 >= args.ttl_s + args.window_s),
                  per_minute[-1])  # fmt: skip
    mem_change = last["redis_used_memory_mb"] / turned["redis_used_memory_mb"] - 1
    unanswered = len(run.unanswered())
    goals = {
        "p99 last minute within 20% of the first after warm-up": p99_first is not None
        and p99_last is not None
        and p99_last <= GOAL_P99_RATIO * p99_first,
        "RSS growth < 10% after warm-up": all(g < GOAL_RSS_GROWTH for g in growth.values()),
        "Redis memory flat once TTLs turn over": abs(mem_change) <= GOAL_REDIS_FLAT,
        "replies == requests": unanswered == 0,
        "lag back to 0": not any(final_lag.values()),
    }
    return {
        "minutes": args.minutes,
        "window_s": args.window_s,
        "max_clicks_per_s": round(max_clicks, 1),
        "max_requests_per_s": round(max_requests, 1),
        "click_rate": click_rate,
        "request_rate": request_rate,
        "per_minute": per_minute,
        "clicks": len(run.clicks),
        "requests": len(run.requests),
        "unanswered": unanswered,
        "duplicate_replies": run.duplicates(),
        "degraded": len(run.degraded()),
        "rss_growth": growth,
        "redis_memory_change_after_ttl": round(mem_change, 3),
        "final_lag": final_lag,
        "workers_alive": alive,
        "goals": goals,
    }


@contextlib.contextmanager
def run_folder(records: Path | None) -> Iterator[Path]:
    """``records`` (created) when given, else a temporary folder removed afterwards."""
    if records is not None:
        records.mkdir(parents=True, exist_ok=True)
        yield records
        return
    with tempfile.TemporaryDirectory(prefix="streamrank-soak-") as tmp:
        yield Path(tmp)


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    with run_folder(args.records) as run_dir, private_stack(run_dir / "stack") as stack:
        return asyncio.run(_soak(args, settings, stack, run_dir))
