"""The measured phases of ``streamrank bench cascade`` (:mod:`workbench.bench.cascade`).

Each phase runs one scoring worker (``streamrank worker scoring`` as a subprocess, serving the
bench's version through ``canary_split``) on request and reply topics of its own, and sends
retrieval requests (no items, ``top_k``):

* ``miss``: the result cache off, so every request runs the stages. Saturation (every request
  queued at once, deadlines far away so none expires) gives ``max_rps``; then open-loop runs
  at the offered ``--rates`` (``0.5x`` = half of ``max_rps``) with the worker's default
  deadline (``cascade_budget_ms`` after the request was produced), so late stages fall back as
  they would in production: end-to-end p50/p99, each stage's p50/p99 from the replies'
  ``timings_ms`` and the degraded replies by reason.
* ``cache-local`` / ``cache-redis``: the result cache in that mode. A fill pass (each user of a
  set once, at most ``--fill-rate``, so that few fall back: a degraded result is not cached)
  then the same requests again (no new click in between): the share answered from
  the cache and the hit path's worker-side time (``timings_ms`` total - queue_wait: the batch's
  one read, the cache lookup and the reply) and end-to-end time. In ``redis`` mode the worker
  is restarted between the passes, so the hits come from Redis, not the local LRU.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from workbench.bench.cpu import host_busy_seconds, process_cpu_seconds
from workbench.bench.loadgen import Driver, RunStats
from workbench.bench.scoring_phases import (
    SCORING_CLI,
    Request,
    phase_settings,
    phase_topics,
    worker_env,
    worker_process,
)
from workbench.devstack.processes import ChildProcess

logger = logging.getLogger(__name__)

CACHE_TTL_S = 600  # the phases' result-cache TTL: a pass and its repeat fit in it
WARM_UP_S = 300  # a worker must load the version (a large index takes a while) by then
WARM_UP_REQUESTS = 50
STAGES = ("retrieval", "filter", "coarse", "rank", "rerank", "sequence_fetch", "queue_wait",
          "total")  # fmt: skip


# --- pure summaries ---------------------------------------------------------------------------


def resolve_rates(spec: str, max_rps: float) -> dict[str, float]:
    """Offered rates by label: ``"0.5x"`` is half of ``max_rps``, ``"40"`` is 40 req/s."""
    out: dict[str, float] = {}
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            continue
        rate = float(token[:-1]) * max_rps if token.endswith("x") else float(token)
        if rate <= 0:
            raise ValueError(f"offered rate {token!r} is not positive (max_rps {max_rps:g})")
        out[token] = round(rate, 1)
    return out


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """p50/p99 (ms) of ``values``; None when there is none."""
    if not len(values):
        return None
    arr = np.asarray(values, dtype=np.float64)
    return {"p50_ms": round(float(np.percentile(arr, 50)), 3),
            "p99_ms": round(float(np.percentile(arr, 99)), 3)}  # fmt: skip


def load_figures(stats: RunStats) -> dict[str, Any]:
    """One run's replies: counts, end-to-end p50/p99, each stage's p50/p99, the worker-side
    time, and the degraded replies by reason."""
    out = stats.summary()
    out.pop("worker_stage_ms_mean", None)
    stages = stats.stage_percentiles()
    out["stages"] = {s: stages[s] for s in STAGES if s in stages}
    out["worker_ms"] = percentiles([stats.worker_ms[r] for r in stats.answered()
                                    if r in stats.worker_ms])  # fmt: skip
    out["degraded_by_reason"] = dict(stats.reasons)
    answered = out["answered"]
    out["undegraded_share"] = round(1 - stats.degraded / answered, 4) if answered else None
    return out


def hit_figures(stats: RunStats) -> dict[str, Any]:
    """The repeated pass: the share answered from the cache, and the cached replies' worker
    time and end-to-end time."""
    answered = stats.answered()
    hits = [r for r in answered if r in stats.cached_ids]
    end_to_end = [(stats.got[r] - stats.sent[r]) * 1000 for r in hits]
    return {
        "sent": len(stats.sent),
        "answered": len(answered),
        "cached_share": round(len(hits) / len(stats.sent), 4) if stats.sent else None,
        "hit_worker_ms": percentiles([stats.worker_ms[r] for r in hits if r in stats.worker_ms]),
        "hit_end_to_end_ms": percentiles(end_to_end),
        "degraded_by_reason": dict(stats.reasons),
    }


def retrieval_requests(prefix: str, users: Sequence[str]) -> list[Request]:
    """One retrieval request (no items) per user, ids ``<prefix>-<n>``."""
    return [(f"{prefix}-{n}", user, []) for n, user in enumerate(users)]


def rss_mb(pid: int) -> float | None:
    """A process's resident memory, MB (None when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


# --- workers ----------------------------------------------------------------------------------


def cascade_env(settings: Settings, version: str, phase: str, cache: str) -> dict[str, str]:
    return worker_env(
        settings,
        STREAMRANK_CANARY_SPLIT=f"{version}:1",
        STREAMRANK_SCORING_GROUP_ID=f"bench-cascade-{version}-{phase}",
        STREAMRANK_CASCADE_RESULT_CACHE=cache,
        STREAMRANK_CASCADE_RESULT_CACHE_TTL_S=str(CACHE_TTL_S),
    )


@contextlib.asynccontextmanager
async def phase_driver(settings: Settings, phase: str, top_k: int) -> AsyncIterator[Driver]:
    """The load generator on the phase's own topics (created here)."""
    own = phase_settings(settings, phase)
    await create_topics(own, topics=phase_topics(own))
    async with Driver(settings=own, requests_topic=own.topics.requests,
                      results_topic=own.topics.results, extra={"top_k": top_k}) as driver:  # fmt: skip
        yield driver


async def warm_up(driver: Driver, version: str, requests: list[Request]) -> None:
    """Until the worker answers with the version undegraded (group joined, version and index
    loaded), then a short warm-up load."""
    deadline = time.monotonic() + WARM_UP_S
    rid, user, items = requests[0]
    while True:
        stats = await driver.open_loop([(f"{rid}-{time.monotonic_ns()}", user, items)], rate=1.0,
                                       drain_s=5.0)  # fmt: skip
        if stats.got and not stats.degraded and version in stats.versions:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the benchmark's worker did not answer with {version} undegraded within "
                f"{WARM_UP_S} s (last: {stats.reasons or 'no reply'}); see its log above"
            )
    await driver.open_loop(requests[1:], rate=50.0, drain_s=30.0)


def _env(settings: Settings, version: str, phase: str, cache: str) -> dict[str, str]:
    return cascade_env(phase_settings(settings, phase), version, phase, cache)


# --- the phases -------------------------------------------------------------------------------


async def miss_phase(
    args: argparse.Namespace, settings: Settings, version: str, users: list[str]
) -> dict[str, Any]:
    """The cache off: saturation (max_rps), then latency at the offered rates."""
    rng = np.random.default_rng(args.seed + 7)

    def take(prefix: str, n: int) -> list[Request]:
        return retrieval_requests(prefix, [users[i] for i in rng.integers(0, len(users), n)])

    out: dict[str, Any] = {}
    async with phase_driver(settings, "miss", args.top_k) as driver:
        with worker_process(SCORING_CLI, _env(settings, version, "miss", "off")) as proc:
            await warm_up(driver, version, take("warm", WARM_UP_REQUESTS))
            out["saturation"] = await saturate(driver, proc, take("sat", args.saturation_requests))
            out["max_rps"] = out["saturation"].pop("max_rps")
            driver.extra = {"top_k": args.top_k, "deadline_ms": None}  # the worker's budget
            out["latency"] = {}
            for label, rate in resolve_rates(args.rates, out["max_rps"]).items():
                stats = await driver.open_loop(take(f"r{label}", max(1, int(rate * args.rate_seconds))),
                                               rate=rate, drain_s=30.0)  # fmt: skip
                out["latency"][label] = {"offered_rps": rate, **load_figures(stats)}
                logger.info("cascade at %s (%.1f req/s): %s", label, rate, out["latency"][label])
            out["worker_rss_mb"] = rss_mb(proc.pid)
    return out


async def saturate(driver: Driver, proc: ChildProcess, requests: list[Request]) -> dict[str, Any]:
    """Every request queued at once: max_rps, the figures of its replies, the worker's CPU per
    request and the host's busy cores meanwhile."""
    cpu0, host0, wall0 = process_cpu_seconds(proc.pid), host_busy_seconds(), time.perf_counter()
    rps, stats = await driver.saturate(requests, drain_s=600.0)
    wall = time.perf_counter() - wall0
    cpu = process_cpu_seconds(proc.pid) - cpu0
    out = {"max_rps": round(rps, 1), **load_figures(stats)}
    share = out["undegraded_share"] or 0.0
    out["undegraded_rps"] = round(rps * share, 1)  # the full cascade's replies per second
    out["worker_cpu_ms_per_request"] = round(cpu * 1000 / max(1, len(stats.got)), 2)
    out["host_busy_cores"] = round((host_busy_seconds() - host0) / wall, 2)
    logger.info("cascade saturated: %s", out)
    return out


async def cache_phase(
    args: argparse.Namespace,
    settings: Settings,
    version: str,
    users: list[str],
    *,
    mode: str,
    rate: float,
) -> dict[str, Any]:
    """A fill pass over ``users`` then the same requests again, the cache in ``mode``; with
    ``redis`` a new worker answers the repeat, so its hits come from Redis."""
    phase = f"cache-{mode}"
    n = max(1, min(len(users) - 2 * WARM_UP_REQUESTS, int(rate * args.cache_seconds)))
    passing = users[:n]
    warm = [users[-1 - k] for k in range(2 * WARM_UP_REQUESTS)]
    fill = retrieval_requests(f"{phase}-fill", passing)
    repeat = retrieval_requests(f"{phase}-hit", passing)
    env = _env(settings, version, phase, mode)
    out: dict[str, Any] = {"mode": mode, "offered_rps": rate, "users": n}
    async with phase_driver(settings, phase, args.top_k) as driver:
        with worker_process(SCORING_CLI, env) as proc:
            await warm_up(driver, version, retrieval_requests(f"{phase}-w1", warm[::2]))
            stats = await driver.open_loop(fill, rate=min(rate, args.fill_rate), drain_s=60.0)
            out["fill"] = load_figures(stats)
            if mode != "redis":
                out["hit"] = await _hits(driver, args, repeat, rate)
                out["worker_rss_mb"] = rss_mb(proc.pid)
        if mode == "redis":  # an empty local LRU: every hit is read from Redis
            with worker_process(SCORING_CLI, env) as proc:
                await warm_up(driver, version, retrieval_requests(f"{phase}-w2", warm[1::2]))
                out["hit"] = await _hits(driver, args, repeat, rate)
                out["worker_rss_mb"] = rss_mb(proc.pid)
    logger.info("result cache %s: %s", mode, out["hit"])
    return out


async def _hits(
    driver: Driver, args: argparse.Namespace, repeat: list[Request], rate: float
) -> dict[str, Any]:
    driver.extra = {"top_k": args.top_k, "deadline_ms": None}
    stats = await driver.open_loop(repeat, rate=rate, drain_s=30.0)
    driver.extra = {"top_k": args.top_k}
    return hit_figures(stats)
