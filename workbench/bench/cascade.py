"""``streamrank bench cascade``: the ranking cascade of retrieval requests, end to end.

Setup (:mod:`workbench.bench.cascade_setup`), on a private embedded stack (the setup writes
item click counters, which cannot be taken back from a shared stack): a catalogue
(``--catalogue ml-100k`` or ``synthetic --items N``), its model version with a retrieval part
(index build time and bytes, the retriever's memory) published through the real path (Redis
memory), the users' sequences, and a day of item clicks for the hot-item pool (its read and
refresh times and memory).

Then, in one run:

* ``in_process``: the version's retriever loaded from Redis as a worker loads it (seconds,
  ``memory_bytes()``), and the stage functions on the users' histories without Kafka: user
  vectors and ANN search at the ``retrieve`` width (one request, and a batch), the coarse cut
  and the rerank, p50/p99;
* ``miss`` (:mod:`workbench.bench.cascade_phases`): one worker, the result cache off:
  ``max_rps``, and at the offered ``--rates`` end-to-end and per-stage p50/p99 and the
  degraded replies by reason;
* ``cache``: a pass of requests repeated with no new click, the cache ``local`` and
  ``redis``: the cached share, the hit path's worker-side and end-to-end p50/p99;
* ``goals``: p99 end to end <= 100 ms at half of ``max_rps``; the hit path's p99 < 2 ms;
* ``host``: the load average before and after (the host is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scoring.serving.wiring import configure_torch
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from workbench.bench import cascade_setup as setup
from workbench.bench.cascade_phases import cache_phase, miss_phase, percentiles, resolve_rates
from workbench.bench.scoring import run_settings

logger = logging.getLogger(__name__)

GOAL_P99_MS = 100.0  # end to end at half of max_rps
GOAL_HIT_P99_MS = 2.0  # the result cache's hit path, worker side
HALF = "0.5x"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalogue", choices=("ml-100k", "synthetic"), default=None,
                        help="ml-100k (default) or a synthetic catalogue of --items items")  # fmt: skip
    parser.add_argument("--items", type=int, default=1_000_000, help="synthetic catalogue size")
    parser.add_argument("--artifact", type=Path, default=None, metavar="DIR",
                        help="ml-100k: serve this artifact (from `streamrank train`, with its "
                        "retrieval part) instead of random weights")  # fmt: skip
    parser.add_argument("--index", choices=("auto", "flat", "ivf", "hnsw"), default=None,
                        help="index kind of a random-weight model (default: flat up to 200k "
                        "items, IVF above)")  # fmt: skip
    parser.add_argument("--users", type=int, default=10_000, help="synthetic users")
    parser.add_argument("--history", type=int, default=50, help="events per user sequence")
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of histories")
    parser.add_argument("--hot-clicks", type=int, default=None,
                        help="item clicks in the day (default 100k for ml-100k, 0.92 per item "
                        "for synthetic)")  # fmt: skip
    parser.add_argument("--top-k", type=int, default=10, help="top_k of every request")
    parser.add_argument("--saturation-requests", type=int, default=1000,
                        help="requests queued at once for max_rps")  # fmt: skip
    parser.add_argument("--rates", default="0.25x,0.5x,0.75x",
                        help="offered rates: req/s, or NUMx = that share of max_rps")  # fmt: skip
    parser.add_argument("--rate-seconds", type=float, default=10.0, help="seconds per rate")
    parser.add_argument("--cache-rate", default=HALF, help="offered rate of the cache phases")
    parser.add_argument("--cache-seconds", type=float, default=5.0,
                        help="seconds per cache pass (its users: rate x seconds)")  # fmt: skip
    parser.add_argument("--fill-rate", type=float, default=20.0,
                        help="most req/s of a cache phase's fill pass")  # fmt: skip
    parser.add_argument("--cache-modes", default="local,redis", help="result cache modes")
    parser.add_argument("--samples", type=int, default=300, help="in-process timings: requests")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: synthetic 20k items, 600 users, short phases")  # fmt: skip


def apply_quick(args: argparse.Namespace) -> None:
    """``--quick``: a small synthetic catalogue and short phases."""
    args.catalogue = "synthetic"
    args.items = min(args.items, 20_000)
    args.users = min(args.users, 600)
    args.hot_clicks = min(args.hot_clicks or 20_000, 20_000)
    args.saturation_requests = min(args.saturation_requests, 300)
    args.rate_seconds = min(args.rate_seconds, 2.0)
    args.cache_seconds = min(args.cache_seconds, 2.0)
    args.samples = min(args.samples, 100)
    args.fill_rate = max(args.fill_rate, 50.0)


def resolve_args(args: argparse.Namespace) -> None:
    """Defaults that depend on other arguments; refuses combinations that make no sense."""
    if args.quick:
        apply_quick(args)
    args.catalogue = args.catalogue or "ml-100k"
    if args.artifact is not None and args.catalogue != "ml-100k":
        raise SystemExit("--artifact serves the ml-100k catalogue; leave out --catalogue")
    if args.artifact is not None and args.index is not None:
        raise SystemExit("--index builds a random-weight model's index; --artifact has its own")
    if args.hot_clicks is None:
        args.hot_clicks = 100_000 if args.catalogue == "ml-100k" else int(0.92 * args.items)
    resolve_rates(args.rates, 1.0)  # a bad spec fails now, not after the setup
    resolve_rates(args.cache_rate, 1.0)


# --- verdict ----------------------------------------------------------------------------------


def verdict(result: dict[str, Any]) -> dict[str, bool]:
    """The goals: p99 end to end within the budget at half of max_rps; the cache's hit path
    p99 under 2 ms (worker side), per cache mode measured."""
    half = result.get("miss", {}).get("latency", {}).get(HALF, {})
    p99 = half.get("p99_ms")
    goals = {f"p99 end to end <= {GOAL_P99_MS:g} ms at {HALF} max_rps": (
        p99 is not None and p99 <= GOAL_P99_MS and half.get("answered") == half.get("sent"))}  # fmt: skip
    for mode, phase in result.get("cache", {}).items():
        hit = (phase.get("hit", {}).get("hit_worker_ms") or {}).get("p99_ms")
        goals[f"cache hit p99 < {GOAL_HIT_P99_MS:g} ms ({mode})"] = (
            hit is not None and hit < GOAL_HIT_P99_MS
        )
    return goals


# --- in process -------------------------------------------------------------------------------


def stage_timings(
    retriever: Any, histories: Sequence[Sequence[str]], settings: Settings, top_k: int
) -> dict[str, Any]:
    """The cascade's stage functions on the histories, without Kafka or budgets: one request
    at a time (user vector, search at the ``retrieve`` width, coarse cut, rerank), and the
    user vectors and search of a batch of 16 (one micro-batch's group)."""
    from scoring.serving.cascade_stages import coarse_cut, rerank_stage, search, user_vectors

    c = settings.cascade
    timings: dict[str, list[float]] = {k: [] for k in ("user_vector", "search", "coarse", "rerank",
                                                       "batch16_user_vectors", "batch16_search")}  # fmt: skip

    def timed(stage: str, call: Any) -> Any:
        t0 = time.perf_counter()
        value = call()
        timings[stage].append((time.perf_counter() - t0) * 1000)
        return value

    for history in histories:
        users = timed("user_vector", lambda h=history: user_vectors(retriever, [h]))
        found = timed("search", lambda u=users: search(retriever, u, c.retrieve))
        cut = timed("coarse", lambda u=users, f=found: coarse_cut(retriever, u, f, c.coarse))
        items, scores = cut[0]
        timed("rerank", lambda i=items, s=scores: rerank_stage(
            retriever, i, s, top_k=top_k, window=c.rerank_window, category_cap=c.category_cap))  # fmt: skip
    for start in range(0, len(histories) - 15, 16):
        chunk = list(histories[start : start + 16])
        users = timed("batch16_user_vectors", lambda h=chunk: user_vectors(retriever, h))
        timed("batch16_search", lambda u=users: search(retriever, u, c.retrieve))
    return {stage: percentiles(values) for stage, values in timings.items()}


async def in_process(
    redis: Any, version: str, histories: list[list[str]], settings: Settings, top_k: int
) -> dict[str, Any]:
    """The retriever loaded from Redis as the worker loads it, and its stage timings."""
    from scoring.model.registry import load_retriever_from_redis, published_config

    started = time.perf_counter()
    retriever = await load_retriever_from_redis(
        redis, version, await published_config(redis, version)
    )
    loaded = round(time.perf_counter() - started, 2)
    if retriever is None:
        raise RuntimeError(f"version {version} was published without its retrieval part")
    configure_torch(settings.scoring)
    out: dict[str, Any] = {"retriever_load_s": loaded,
                           "retriever_memory_bytes": retriever.memory_bytes(),
                           "retrieve": settings.cascade.retrieve, "coarse": settings.cascade.coarse}  # fmt: skip
    out["stages_ms"] = stage_timings(retriever, histories, settings, top_k)
    return out


# --- run --------------------------------------------------------------------------------------


@contextlib.contextmanager
def private_stack(settings: Settings) -> Iterator[Settings]:
    """An embedded broker and Redis on free ports for the run, stopped at the end."""
    from workbench.devstack.stack import EmbeddedStack

    with tempfile.TemporaryDirectory(prefix="streamrank-bench-cascade-") as tmp:
        stack = EmbeddedStack.on_free_ports(Path(tmp))
        logger.info("starting a private stack (kafka %s, redis %s)", stack.bootstrap,
                    stack.redis_url)  # fmt: skip
        stack.up(timeout_s=120)
        try:
            yield stack.settings_for(settings).with_env(STREAMRANK_RUN_DIR=tmp)
        finally:
            stack.down()


async def prepare(
    args: argparse.Namespace, settings: Settings, redis: Any, tag: str, workdir: Path
) -> tuple[str, setup.Catalogue, dict[str, Any]]:
    """The catalogue, its version published, sequences and hot clicks written; the version
    and the setup's figures."""
    from scoring.model.artifact import load_artifact

    t0 = time.perf_counter()
    if args.catalogue == "ml-100k":
        catalogue = setup.ml100k_catalogue(settings, args.history, tag)
    else:
        catalogue = setup.synthetic_catalogue(args.items, users=args.users, history=args.history,
                                              zipf=args.zipf, seed=args.seed, tag=tag)  # fmt: skip
    figures: dict[str, Any] = {"catalogue_s": round(time.perf_counter() - t0, 1)}
    if args.artifact is not None:
        artifact = load_artifact(args.artifact)
        figures["model"] = f"trained artifact {artifact.path}"
        figures["index"] = setup.trained_index(artifact)
    else:
        logger.info("building a random-weight model over %d items", len(catalogue.item_ids))
        path, figures["index"] = setup.random_artifact(
            catalogue, index=args.index, seed=args.seed, workdir=workdir,
            version=f"bench-cascade-{tag}",
        )  # fmt: skip
        t0 = time.perf_counter()
        artifact = load_artifact(path)
        figures["model"] = "random weights (DIN int8 and two-tower)"
        figures["artifact_load_s"] = round(time.perf_counter() - t0, 1)
    figures.update(await setup.publish(redis, artifact))
    figures["sequences"] = await setup.store_sequences(redis, catalogue)
    logger.info("writing a day of %d item clicks for the hot pool", args.hot_clicks)
    figures["hot_pool"] = await setup.hot_clicks(redis, catalogue, settings,
                                                 clicks=args.hot_clicks, seed=args.seed)  # fmt: skip
    return artifact.version, catalogue, figures


async def _run(args: argparse.Namespace, base: Settings) -> dict[str, Any]:
    tag = setup.run_tag()
    settings = run_settings(base, tag, args.history)
    redis = redis_client(settings.redis, timeout_s=60)
    result: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="streamrank-bench-cascade-model-") as workdir:
            version, catalogue, result["setup"] = await prepare(args, settings, redis, tag,
                                                                Path(workdir))  # fmt: skip
        users = list(catalogue.histories)
        rng = np.random.default_rng(args.seed)
        sample = [catalogue.histories[users[i]] for i in rng.integers(0, len(users), args.samples)]
        logger.info("in-process stage timings over %d histories", len(sample))
        result["in_process"] = await in_process(redis, version, sample, settings, args.top_k)
        result["miss"] = await miss_phase(args, settings, version, users)
        result["cache"] = {}
        for mode in [m.strip() for m in args.cache_modes.split(",") if m.strip()]:
            rate = resolve_rates(args.cache_rate, result["miss"]["max_rps"])
            shuffled = [users[i] for i in rng.permutation(len(users))]
            result["cache"][mode] = await cache_phase(args, settings, version, shuffled,
                                                      mode=mode, rate=next(iter(rate.values())))  # fmt: skip
    finally:
        await redis.aclose()
    result["goals"] = verdict(result)
    result["config"] = run_config(args, settings, catalogue.name, len(catalogue.item_ids))
    return result


def run_config(
    args: argparse.Namespace, settings: Settings, name: str, items: int
) -> dict[str, Any]:
    c = settings.cascade
    return {
        "catalogue": name, "items": items, "top_k": args.top_k, "history": args.history,
        "retrieve": c.retrieve, "coarse": c.coarse, "rerank_window": c.rerank_window,
        "budget_ms": c.budget_ms, "budgets_ms": c.budgets_ms(), "hot_pool": c.hot_pool,
        "batch_max": settings.scoring.batch_max, "torch_threads": settings.scoring.torch_threads,
        "rates": args.rates, "rate_seconds": args.rate_seconds, "cache_rate": args.cache_rate,
        "saturation_requests": args.saturation_requests, "cpus": os.cpu_count(),
        "stack": "private",
    }  # fmt: skip


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    resolve_args(args)
    started = time.perf_counter()
    with private_stack(settings) as stack_settings:
        result = asyncio.run(_run(args, stack_settings))
    result["host"] = {"run_s": round(time.perf_counter() - started, 1)}
    return result
