"""The measured phases of ``streamrank bench scoring`` (:mod:`workbench.bench.scoring`).

Per forward mode: the scoring worker(s) as subprocesses, warmed up, saturated, and (the first
mode) driven at the offered rates; right after the first mode, the echo worker, the floor, the
same way; last, the naive worker saturated. Each phase has request and reply topics of its own
(:func:`phase_settings`), and each request is sent once (:class:`RequestFeed`). Also the DIN
serving forward alone on the same inputs (:func:`forward_only`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from scoring.serving.assemble import assemble, gather
from scoring.serving.deep_rank import forward
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from workbench.bench.cpu import host_busy_seconds, process_cpu_seconds
from workbench.bench.loadgen import Driver, RunStats
from workbench.devstack import processes
from workbench.devstack.processes import ChildProcess, start_child

logger = logging.getLogger(__name__)

Request = tuple[str, str, list[str]]  # (request_id, user_id, items)
Take = Callable[[int], list[Request]]

SCORING_CLI = [sys.executable, "-m", "workbench.cli", "worker", "scoring", "--metrics-port", "0"]
NAIVE_CLI = [sys.executable, "-m", "workbench.bench.naive"]
ECHO_CLI = [sys.executable, "-m", "workbench.bench.echo"]
FLOOR_CLI = [sys.executable, "-m", "workbench.bench.floor"]
HALF_MAX_CAP = 1000  # req/s: the most the "half of max_rps" latency rate may be
PREVIOUS_SCORER = {  # the scorer before the inference runtimes: eager, glibc's allocator
    "STREAMRANK_SCORING_RUNTIME": "eager",
    "STREAMRANK_SCORING_RETAIN_FREED_MB": "0",
}


class RequestFeed:
    """The run's requests handed out in order, so that no phase sends one twice."""

    def __init__(self, requests: list[Request]) -> None:
        self._requests = requests
        self._cursor = 0

    def take(self, n: int) -> list[Request]:
        chunk = self._requests[self._cursor : self._cursor + n]
        self._cursor += n
        return chunk


# --- workers ----------------------------------------------------------------------------------


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a benchmark worker: every setting, no /metrics, quiet logs."""
    quiet = {"STREAMRANK_METRICS_PORT": "0", "STREAMRANK_LOG_LEVEL": "WARNING"}
    return processes.worker_env(settings, {**quiet, **extra})


class LoadgenCpu:
    """This process's (the load generator's) CPU since construction, as % of one core."""

    def __init__(self) -> None:
        self._cpu, self._wall = process_cpu_seconds(os.getpid()), time.perf_counter()

    def percent(self) -> float:
        used = process_cpu_seconds(os.getpid()) - self._cpu
        return round(100 * used / max(1e-9, time.perf_counter() - self._wall), 1)


@contextlib.contextmanager
def worker_process(argv: list[str], env: dict[str, str]) -> Iterator[ChildProcess]:
    """A worker child for the run (its output goes to ours), stopped at the end."""
    child = start_child(argv, what="benchmark worker", env=env)
    try:
        yield child
    finally:
        child.stop(timeout_s=15)


async def warm_up(driver: Driver, requests: list[Request]) -> None:
    """Until the worker answers (group joined, model loaded), then a short warm-up load."""
    deadline = time.monotonic() + 120
    for rid, user, items in requests[:1]:
        while time.monotonic() < deadline:
            stats = await driver.open_loop([(f"{rid}-{time.monotonic_ns()}", user, items)],
                                           rate=1.0, drain_s=5.0)  # fmt: skip
            if stats.got:
                break
        else:
            raise TimeoutError("the benchmark's worker did not answer within 120 s")
    await driver.open_loop(requests[1:], rate=200.0, drain_s=30.0)


def phase_settings(settings: Settings, phase: str) -> Settings:
    """Each phase's worker gets request and reply topics of its own: a new group starts at the
    earliest offset and must not answer the previous phases' requests again, and a phase's
    replies are read from a topic the earlier phases did not fill (the embedded broker's fetches
    slow down as a partition grows)."""
    return settings.with_env(
        STREAMRANK_TOPIC_REQUESTS=f"{settings.topics.requests}-{phase}",
        STREAMRANK_TOPIC_RESULTS=f"{settings.topics.results}-{phase}",
    )


def phase_topics(settings: Settings) -> tuple[str, str]:
    return settings.topics.requests, settings.topics.results


def phase_driver(settings: Settings) -> Driver:
    """The load generator on the phase's own request and reply topics."""
    return Driver(settings=settings, requests_topic=settings.topics.requests,
                  results_topic=settings.topics.results)  # fmt: skip


def cpu_ms_per_reply(cpu_s: float, stats: RunStats) -> float:
    return cpu_s * 1000 / max(1, len(stats.got))


# --- measurements -----------------------------------------------------------------------------


async def latency_at(
    driver: Driver, take: Take, rates: list[float], seconds: float
) -> dict[str, dict[str, Any]]:
    """p50/p99 at each offered rate, with the load generator's own CPU (% of one core)."""
    out: dict[str, dict[str, Any]] = {}
    for rate in rates:
        loadgen = LoadgenCpu()
        stats = await driver.open_loop(take(int(rate * seconds)), rate=rate)
        summary = stats.summary()
        summary["loadgen_cpu_percent"] = loadgen.percent()
        if trace := stats.tail_trace():
            summary["tail_trace"] = trace
        out[f"{rate:g}"] = summary
        logger.info("offered %s req/s: %s", rate, summary)
    return out


async def measure(
    args: argparse.Namespace,
    settings: Settings,
    naive_settings: Settings,
    version: str,
    requests: list[Request],
    modes: list[str],
    rates: list[float],
) -> dict[str, Any]:
    """Every phase in order; the figures of ``bench scoring`` that come from the workers."""
    out: dict[str, Any] = {
        "max_rps_by_forward": {},
        "worker_cpu_ms_per_request": {},
        "latency": {},
        "degraded_replies": 0,
    }
    feed = RequestFeed(requests)
    for n, mode in enumerate(modes):
        # latency with the first mode only, at the offered rates and half its max_rps
        await measure_mode(args, settings, version, mode, feed, out, rates=rates if n == 0 else [])
        if n == 0:  # the floors right after: the broker and the host as close as they get
            measured = [float(r) for r in out["latency"]]
            out["echo"] = await measure_echo(args, settings, version, feed.take, measured)
            out["floor"] = await measure_echo(
                args, settings, version, feed.take, measured, phase="floor"
            )
    best = max(out["max_rps_by_forward"], key=out["max_rps_by_forward"].get)
    out["max_rps"] = out["max_rps_by_forward"][best]
    out["max_rps_forward_mode"] = best
    out["overhead_p99_ms"] = overhead_p99_ms(out["latency"], out["echo"]["latency"])
    out["overhead_vs_floor_p99_ms"] = overhead_p99_ms(out["latency"], out["floor"]["latency"])
    if args.runtime_ab:
        out["runtime_ab"] = await measure_previous_scorer(args, settings, version, best, feed)
    await measure_naive(args, naive_settings, version, feed, out)
    return out


async def measure_previous_scorer(
    args: argparse.Namespace, settings: Settings, version: str, mode: str, feed: RequestFeed
) -> dict[str, Any]:
    """The scorer before the inference runtimes (:data:`PREVIOUS_SCORER`) saturated the same
    way, then the current one again: ``current`` is the mean of its two saturations."""
    previous: dict[str, Any] = {"max_rps_by_forward": {}, "worker_cpu_ms_per_request": {},
                                "degraded_replies": 0}  # fmt: skip
    current: dict[str, Any] = {"max_rps_by_forward": {}, "worker_cpu_ms_per_request": {},
                               "degraded_replies": 0}  # fmt: skip
    await measure_mode(args, settings, version, mode, feed, previous, rates=[],
                       phase="previous", env=PREVIOUS_SCORER)  # fmt: skip
    await measure_mode(args, settings, version, mode, feed, current, rates=[], phase="current")
    before, now = previous["max_rps_by_forward"][mode], current["max_rps_by_forward"][mode]
    return {
        "mode": mode,
        "previous": {"max_rps": before, **PREVIOUS_SCORER,
                     "worker_cpu_ms_per_request": previous["worker_cpu_ms_per_request"][mode]},
        "current": {"max_rps": now, "runtime": settings.scoring.runtime,
                    "worker_cpu_ms_per_request": current["worker_cpu_ms_per_request"][mode]},
        "max_rps_vs_previous": round(now / before, 3) if before else None,
    }  # fmt: skip


def overhead_p99_ms(
    ours: dict[str, dict[str, Any]], echo: dict[str, dict[str, Any]]
) -> dict[str, float]:
    """Our p99 minus the echo's, at each offered rate both measured."""
    return {
        rate: round(figures["p99_ms"] - echo[rate]["p99_ms"], 2)
        for rate, figures in ours.items()
        if "p99_ms" in figures and "p99_ms" in echo.get(rate, {})
    }


async def measure_mode(
    args: argparse.Namespace,
    settings: Settings,
    version: str,
    mode: str,
    feed: RequestFeed,
    out: dict[str, Any],
    *,
    rates: list[float],
    phase: str = "",
    env: dict[str, str] | None = None,
) -> None:
    """One forward mode: ``args.workers`` scoring workers saturated, then driven at ``rates``
    and at half their max_rps (no rates: no latency phase); the figures go into ``out``.
    ``phase`` names an extra run of a mode (its own topics and group), ``env`` its settings."""
    name = f"{mode}-{phase}" if phase else mode
    mode_settings = phase_settings(settings, name)
    await create_topics(mode_settings, topics=phase_topics(mode_settings))
    env = worker_env(mode_settings, STREAMRANK_CANARY_SPLIT=f"{version}:1",
                     STREAMRANK_SCORING_FORWARD=mode,
                     STREAMRANK_SCORING_GROUP_ID=f"bench-scoring-{version}-{name}",
                     **(env or {}))  # fmt: skip
    with contextlib.ExitStack() as workers:
        procs = [workers.enter_context(worker_process(SCORING_CLI, env))
                 for _ in range(args.workers)]  # fmt: skip
        async with Driver(settings=settings, requests_topic=mode_settings.topics.requests,
                          results_topic=mode_settings.topics.results) as driver:  # fmt: skip
            await warm_up(driver, feed.take(200))
            if args.workers > 1:
                # The first reply came from the first worker to join; the others' joins
                # rebalance the group (Tansu pads each join ~3 s): let it settle first.
                await asyncio.sleep(10)
                await driver.open_loop(feed.take(200), rate=200.0, drain_s=30.0)
            await saturate_mode(driver, procs, mode, feed.take(args.saturation_requests), out)
            if rates:
                half = min(HALF_MAX_CAP, round(out["max_rps_by_forward"][mode] / 2))
                out["half_max_rps_rate"] = half
                rates = sorted({*rates, float(half)})
                out["latency"] = await latency_at(driver, feed.take, rates, args.rate_seconds)
                out["degraded_replies"] += sum(v["degraded"] for v in out["latency"].values())


async def saturate_mode(
    driver: Driver,
    procs: list[ChildProcess],
    mode: str,
    requests: list[Request],
    out: dict[str, Any],
) -> None:
    """Every request queued at once: the workers' max_rps and CPU, the load generator's and
    the host's CPU meanwhile."""
    cpu0 = sum(process_cpu_seconds(p.pid) for p in procs)
    loadgen, host0, wall0 = LoadgenCpu(), host_busy_seconds(), time.perf_counter()
    rps, stats = await driver.saturate(requests)
    out.setdefault("saturation_loadgen_cpu_percent", {})[mode] = loadgen.percent()
    out.setdefault("saturation_host_busy_cores", {})[mode] = round(
        (host_busy_seconds() - host0) / (time.perf_counter() - wall0), 2
    )
    cpu1 = sum(process_cpu_seconds(p.pid) for p in procs)
    out["worker_cpu_ms_per_request"][mode] = round(cpu_ms_per_reply(cpu1 - cpu0, stats), 2)
    out.setdefault("saturation_stage_ms_mean", {})[mode] = stats.summary().get(
        "worker_stage_ms_mean"
    )
    out["degraded_replies"] += stats.degraded
    out["max_rps_by_forward"][mode] = round(rps, 1)
    logger.info("forward %s: max_rps %.1f (%s)", mode, rps, stats.summary())


async def measure_echo(
    args: argparse.Namespace,
    settings: Settings,
    version: str,
    take: Take,
    rates: list[float],
    *,
    phase: str = "echo",
) -> dict[str, Any]:
    """A floor on its own request topic, saturated then at the same offered rates: ``echo``
    (:mod:`workbench.bench.echo`, our intake loop) or ``floor`` (:mod:`workbench.bench.floor`,
    the minimal aiokafka client)."""
    echo_settings = phase_settings(settings, phase).with_env(
        STREAMRANK_SCORING_GROUP_ID=f"bench-{phase}-{version}"
    )
    await create_topics(echo_settings, topics=phase_topics(echo_settings))
    argv = ECHO_CLI if phase == "echo" else FLOOR_CLI
    with worker_process(argv, worker_env(echo_settings)) as proc:
        async with phase_driver(echo_settings) as driver:
            await warm_up(driver, take(200))
            cpu0 = process_cpu_seconds(proc.pid)
            loadgen = LoadgenCpu()
            rps, stats = await driver.saturate(take(args.saturation_requests))
            cpu_ms = cpu_ms_per_reply(process_cpu_seconds(proc.pid) - cpu0, stats)
            logger.info("%s: max_rps %.1f (%s)", phase, rps, stats.summary())
            return {
                "max_rps": round(rps, 1),
                "worker_cpu_ms_per_request": round(cpu_ms, 3),
                "saturation_loadgen_cpu_percent": loadgen.percent(),
                "latency": await latency_at(driver, take, rates, args.rate_seconds),
            }


async def measure_naive(
    args: argparse.Namespace,
    naive_settings: Settings,
    version: str,
    feed: RequestFeed,
    out: dict[str, Any],
) -> None:
    """The naive worker (:mod:`workbench.bench.naive`) saturated; its figures go into ``out``."""
    env = worker_env(naive_settings, STREAMRANK_BENCH_NAIVE_VERSION=f"{version}-fp32",
                     STREAMRANK_BENCH_MODEL_VERSION=version,
                     STREAMRANK_SCORING_GROUP_ID=f"bench-naive-{version}")  # fmt: skip
    with worker_process(NAIVE_CLI, env) as proc:
        async with phase_driver(naive_settings) as driver:
            await warm_up(driver, feed.take(10))
            cpu0 = process_cpu_seconds(proc.pid)
            rps, stats = await driver.saturate(feed.take(args.naive_requests))
            cpu_ms = cpu_ms_per_reply(process_cpu_seconds(proc.pid) - cpu0, stats)
            out["worker_cpu_ms_per_request"]["naive"] = round(cpu_ms, 2)
            out["naive_max_rps"] = round(rps, 1)
            logger.info("naive: max_rps %.1f (%s)", rps, stats.summary())


def forward_only(
    scorer: Any,
    table: np.ndarray,
    requests: list[Request],
    histories: dict[str, list[str]],
    *,
    batch: int,
) -> dict[str, float]:
    """Requests/s of the serving forward alone, per request and batched, on the same inputs."""
    out: dict[str, float] = {}
    chunks = [requests[i : i + batch] for i in range(0, len(requests) - batch + 1, batch)]
    prepared = []
    for chunk in chunks:
        assembled = assemble([histories[u] for _, u, _ in chunk], [c for _, _, c in chunk],
                             max_history=10**6)  # fmt: skip
        rows = table[[int(i[1:]) for i in assembled.unique_ids]]
        hist, cands = gather(rows, assembled)
        prepared.append((hist, assembled.hist_mask, cands, assembled.cand_mask))
    for mode in ("per_request", "batched"):
        forward(scorer, *prepared[0], mode=mode)
        started = time.perf_counter()
        for p in prepared:
            forward(scorer, *p, mode=mode)
        out[mode] = round(len(prepared) * batch / (time.perf_counter() - started), 1)
    return out
