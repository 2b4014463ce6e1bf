"""``streamrank bench scoring``: end-to-end ranking throughput and latency through the broker.

Setup: a synthetic DIN version (random weights, item table of ``--items`` ids, int8) published
through the real artifact -> store path, users with ``--history`` events each in Redis, Zipf
traffic of ``--candidates`` items per request. Then, with one worker process (a subprocess,
``streamrank worker scoring``, serving the version through the ``canary_split`` setting so the
stack's active pointer is left alone):

* ``max_rps``: reply rate with every request queued at once (saturation), for both forward
  modes (per request / batched across requests); the default mode is the faster one;
* ``latency``: p50/p99 (client send -> reply received) at fixed offered rates;
* ``naive_max_rps``: the naive worker (``workbench.bench.naive``) in the same run;
* ``echo``: the floor, the echo worker (``workbench.bench.echo``: same broker, topics and
  client settings, replies without lookup or compute), its ``max_rps`` and ``latency`` at the
  same rates; ``overhead_p99_ms`` = our p99 minus the echo's at each rate;
* ``loadgen_cpu_percent`` (per rate) and ``saturation_loadgen_cpu_percent``: the load
  generator's own CPU (% of one core), and ``saturation_host_busy_cores`` (the host's busy
  cores while saturated: broker, Redis, worker and load generator share them), to see what
  the host was doing;
* ``forward_only_rps``: the DIN serving forward alone on the same inputs.

If the configured stack does not answer, a private embedded stack is started on free ports
and stopped afterwards.
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import redis.asyncio as aioredis
from tqdm import tqdm

from scoring.serving.wiring import configure_torch
from streamrank import clock, keys
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client, used_memory
from streamrank.settings import Settings
from workbench.bench import compare
from workbench.bench.loadgen import make_requests, zipf_ids
from workbench.bench.scoring_features import requests_needed as features_requests
from workbench.bench.scoring_phases import (
    HALF_MAX_CAP,
    Request,
    forward_only,
    measure,
    phase_settings,
    phase_topics,
)

if TYPE_CHECKING:
    from scoring.embeddings.store import EmbeddingStore
    from scoring.model.features import FeatureSpec

logger = logging.getLogger(__name__)

GOAL_MAX_RPS = 1000.0
GOAL_SHARE_OF_FORWARD = 0.65
GOAL_P99_MS_AT_200 = 25.0
GOAL_OVERHEAD_P99_MS = 10.0
GOAL_SPEEDUP = 3.0
GOAL_VS_FLOOR_P99_MS = 15.0  # ours minus the true floor, at half of max_rps
GOAL_VS_PREVIOUS = 1.6  # max_rps against the scorer before the inference runtimes
GOAL_SHARE_OF_FORWARD_RUNTIME = 0.6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--items", type=int, default=1_000_000, help="item table size")
    parser.add_argument("--candidates", type=int, default=100, help="candidates per request")
    parser.add_argument("--history", type=int, default=50, help="events per user sequence")
    parser.add_argument("--users", type=int, default=10_000, help="distinct users")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of item traffic")
    parser.add_argument(
        "--saturation-requests", type=int, default=4000, help="requests queued for max_rps"
    )
    parser.add_argument("--rates", default="100,200,400", help="offered rates for latency, req/s")
    parser.add_argument("--rate-seconds", type=float, default=10.0, help="seconds per rate")
    parser.add_argument("--naive-requests", type=int, default=300, help="requests for the naive")
    parser.add_argument(
        "--modes",
        default="per_request,batched",
        help="forward modes to measure end to end (the first measured fastest is the default)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="scoring worker processes in the group (e.g. 2 on 2 cores: one per core against "
        "two per core with --workers 4); max_rps is theirs together",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 20k items, 1k users, short phases",
    )
    parser.add_argument(
        "--runtime-ab",
        action="store_true",
        help="also saturate the scorer before the inference runtimes (eager, glibc's allocator "
        "thresholds) and the current one again, same mode, same run: runtime_ab",
    )
    parser.add_argument(
        "--features",
        action="store_true",
        help="also saturate a version with every feature family against the sequence-only one "
        "(alternating, same run): features_ab.features_vs_sequence",
    )
    compare.add_arguments(parser)


def _quick(args: argparse.Namespace) -> None:
    args.items = min(args.items, 20_000)
    args.users = min(args.users, 1_000)
    args.saturation_requests = min(args.saturation_requests, 1000)
    args.rate_seconds = min(args.rate_seconds, 3.0)
    args.naive_requests = min(args.naive_requests, 60)


# --- stack ------------------------------------------------------------------------------------


@contextlib.contextmanager
def bench_stack(settings: Settings) -> Iterator[tuple[Settings, str]]:
    """The configured stack when it answers, else a private embedded one (stopped at exit)."""
    from workbench.devstack.pipeline import stack_or_private

    with (
        tempfile.TemporaryDirectory(prefix="streamrank-bench-") as tmp,
        stack_or_private(settings, run_dir=Path(tmp), say=logger.info) as (use, stack),
    ):
        yield use, "configured" if stack is None else "private"


# --- setup ------------------------------------------------------------------------------------


async def publish_synthetic(
    redis: aioredis.Redis,
    *,
    n_items: int,
    seed: int,
    version: str,
    workdir: Path,
    features: FeatureSpec | None = None,
) -> tuple[Any, np.ndarray]:
    """A random-weight DIN (with ``features``' side inputs) and item table, saved as an
    artifact and published; returns the scorer and the float32 item table (row n = ``i{n}``)."""
    import torch

    from scoring.model.artifact import load_artifact, save_artifact
    from scoring.model.din import DIN, ModelSpec, dense_state
    from scoring.model.registry import publish_artifact

    spec = ModelSpec()
    if features is not None:
        spec = ModelSpec(categorical_sizes=tuple(n for _, n in features.categorical),
                         dense_features=len(features.counters))  # fmt: skip
    torch.manual_seed(seed)
    net = DIN(spec)
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((n_items, spec.item_dim), dtype=np.float32) * 0.3).astype(
        np.float32
    )
    path = save_artifact(
        workdir,
        spec=spec,
        dense_state=dense_state(net),
        item_ids=[f"i{n}" for n in range(n_items)],
        item_table=table,
        oov_row=np.zeros(spec.item_dim, dtype=np.float32),
        encoding="int8",
        feature_spec={
            "synthetic": True,
            **({"inputs": features.to_json()} if features is not None else {}),
        },
        data={"synthetic": {"items": n_items, "seed": seed}},
        metrics={},
        train={"note": "random weights: a throughput benchmark, not a trained model"},
        version=version,
    )
    artifact = load_artifact(path)
    await publish_artifact(redis, artifact, progress=True)
    return artifact.scorer(), table


async def write_sequences(
    redis: aioredis.Redis, histories: dict[str, list[str]], *, start_ms: int
) -> None:
    """Users' sequences in the feature store's layout (``keys.sequence``/``sequence_member``)."""
    pipe = redis.pipeline(transaction=False)
    for n, (user, items) in enumerate(tqdm(histories.items(), desc="sequences", unit="user")):
        members = {
            keys.sequence_member(f"{user}-{k:04d}", item, None): start_ms + k
            for k, item in enumerate(items)
        }
        pipe.zadd(keys.sequence(user), members)
        if n % 500 == 499:
            await pipe.execute()
    await pipe.execute()


# --- run --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """What the setup put in Redis: the model (scorer and float32 item table) and the memory
    it took (used_memory, summed over masters)."""

    scorer: Any
    table: np.ndarray
    bytes_per_row: float  # the int8 item table: rows, bucket keys, publish ids, dense weights
    bytes_per_user: float  # the users' sequences


def run_settings(base: Settings, tag: str, history: int) -> Settings:
    """The run's own topics (each phase adds a suffix) and sequence length."""
    return base.with_env(
        STREAMRANK_TOPIC_REQUESTS=f"bench-rank-requests-{tag}",
        STREAMRANK_TOPIC_RESULTS=f"bench-rank-results-{tag}",
        STREAMRANK_TOPIC_DEAD_LETTERS=f"bench-dead-letters-{tag}",
        STREAMRANK_SEQUENCE_LENGTH=history,
    )


def requests_needed(args: argparse.Namespace, modes: list[str], rates: list[float]) -> int:
    """Every mode's warm-up and saturation, the echo's and the floor's (warm-up, saturation,
    the rates), the rates at half of max_rps (at most HALF_MAX_CAP), the naive's, the runtime
    A/B's two saturations, and the extra warm-up of several workers."""
    n_rate = sum(int(r * args.rate_seconds) for r in rates) + int(HALF_MAX_CAP * args.rate_seconds)
    runs = len(modes) + 2 + (2 if args.runtime_ab else 0)  # saturated runs of a worker
    settle = 200 * runs if args.workers > 1 else 0
    return (200 * runs + settle + args.saturation_requests * runs
            + 3 * n_rate + args.naive_requests + 50)  # fmt: skip


def make_traffic(
    args: argparse.Namespace, tag: str, total: int
) -> tuple[list[Request], dict[str, list[str]]]:
    """``total`` Zipf requests and every user's history, user ids private to the run."""
    requests = make_requests(n=total, users=args.users, n_items=args.items,
                             candidates=args.candidates, zipf_a=args.zipf, seed=args.seed)  # fmt: skip
    requests = [(rid, f"b{tag}{user}", items) for rid, user, items in requests]
    rng = np.random.default_rng(args.seed + 1)
    hist_items = zipf_ids(rng, args.users * args.history, n_items=args.items, a=args.zipf)
    hist_items = hist_items.reshape(args.users, args.history)
    histories = {f"b{tag}u{u}": [f"i{int(x)}" for x in hist_items[u]] for u in range(args.users)}
    return requests, histories


async def store_inputs(
    redis: aioredis.Redis,
    store: EmbeddingStore,
    args: argparse.Namespace,
    version: str,
    traffic: tuple[list[Request], dict[str, list[str]]],
    workdir: Path,
    timings: dict[str, float],
) -> Stored:
    """The int8 model, the naive worker's fp32 rows of the items used, and the sequences."""
    requests, histories = traffic
    t0 = time.perf_counter()
    memory = await used_memory(redis)
    scorer, table = await publish_synthetic(
        redis, n_items=args.items, seed=args.seed, version=version, workdir=workdir
    )
    timings["publish_s"] = round(time.perf_counter() - t0, 1)
    bytes_per_row = (await used_memory(redis) - memory) / args.items
    t0 = time.perf_counter()
    used = sorted({i for _, _, items in requests for i in items}
                  | {i for h in histories.values() for i in h})  # fmt: skip
    await store.publish("item", used, table[[int(i[1:]) for i in used]], encoding="fp32",
                        version=f"{version}-fp32", progress=False)  # fmt: skip
    timings["publish_naive_fp32_s"] = round(time.perf_counter() - t0, 1)
    memory = await used_memory(redis)
    await write_sequences(redis, histories, start_ms=clock.now_ms() - 10**6)
    bytes_per_user = (await used_memory(redis) - memory) / args.users
    return Stored(scorer, table, bytes_per_row, bytes_per_user)


async def remove_inputs(
    redis: aioredis.Redis, store: EmbeddingStore, version: str, users: list[str]
) -> None:
    """The run's versions and sequences, best effort."""
    from scoring.model.registry import delete_version

    with contextlib.suppress(Exception):
        await delete_version(store, version, force=True)
        await delete_version(store, f"{version}-fp32", force=True)
        await redis.delete(keys.model_dense(version), keys.model_config(version))
        user_keys = [keys.sequence(u) for u in users]
        for i in range(0, len(user_keys), 1000):
            await redis.delete(*user_keys[i : i + 1000])


async def _run(args: argparse.Namespace, base: Settings, stack_kind: str) -> dict[str, Any]:
    from scoring.embeddings.store import EmbeddingStore
    from scoring.model.registry import load_scorer_from_redis

    tag = uuid.uuid4().hex[:8]
    version = f"bench-din-{tag}"
    settings = run_settings(base, tag, args.history)
    naive_settings = phase_settings(settings, "naive")
    await create_topics(settings, topics=(settings.topics.dead_letters,
                                          *phase_topics(naive_settings)))  # fmt: skip
    redis = redis_client(settings.redis, timeout_s=30)
    timings: dict[str, float] = {}
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    t0 = time.perf_counter()
    extra = features_requests(args) if args.features else 0
    requests, histories = make_traffic(args, tag, requests_needed(args, modes, rates) + extra)
    timings["traffic_s"] = round(time.perf_counter() - t0, 1)
    store = EmbeddingStore(redis=redis)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="streamrank-bench-model-") as workdir:
        try:
            stored = await store_inputs(redis, store, args, version, (requests, histories),
                                        Path(workdir), timings)  # fmt: skip
            result = await measure(args, settings, naive_settings, version, requests, modes,
                                   rates)  # fmt: skip
            configure_torch(settings.scoring)  # the same thread settings as the worker
            served, _config = await load_scorer_from_redis(  # as the worker loads it
                redis, version, runtime=settings.scoring.runtime,
                threads=settings.scoring.torch_threads,
            )  # fmt: skip
            fwd = forward_only(served, stored.table, requests[:512], histories,
                               batch=settings.scoring.batch_max)  # fmt: skip
            if args.features:
                result["features_ab"] = await _features_ab(
                    args, settings, redis, version, result, requests[len(requests) - extra :],
                    Path(workdir),
                )  # fmt: skip
            result["forward_only_rps"] = max(fwd.values())
            result["forward_only_rps_by_mode"] = fwd
            result["forward_only_runtime"] = served.runtime
            result["redis_bytes_per_embedding_row"] = round(stored.bytes_per_row, 1)
            result["redis_bytes_per_user_sequence"] = round(stored.bytes_per_user, 1)
        finally:
            await remove_inputs(redis, store, version, list(histories))
            if args.features:
                await remove_inputs(redis, store, f"{version}-features", [])
            await redis.aclose()
    result.update(verdict(result))
    result["config"] = run_config(args, settings, stack_kind)
    result["setup"] = timings
    return result


async def _features_ab(
    args: argparse.Namespace,
    settings: Settings,
    redis: aioredis.Redis,
    version: str,
    result: dict[str, Any],
    requests: list[Request],
    workdir: Path,
) -> dict[str, Any]:
    """The features version published beside the sequence-only one, both saturated."""
    from workbench.bench.scoring_features import bench_feature_spec, features_ab

    features_version = f"{version}-features"
    await publish_synthetic(
        redis, n_items=args.items, seed=args.seed, version=features_version,
        workdir=workdir / "features", features=bench_feature_spec(args.history),
    )  # fmt: skip
    return await features_ab(
        args, settings, sequence_version=version, features_version=features_version,
        mode=result.get("max_rps_forward_mode", "batched"), requests=requests,
    )  # fmt: skip


# --- report -----------------------------------------------------------------------------------


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """The ratios against the naive worker and the forward alone, and the goals met."""
    max_rps = result.get("max_rps", 0.0)
    naive = result.get("naive_max_rps", 0.0)
    p99_200 = result.get("latency", {}).get("200", {}).get("p99_ms")
    forward_rps = result.get("forward_only_rps", 0.0)
    overhead_200 = result.get("overhead_p99_ms", {}).get("200")
    half = result.get("half_max_rps_rate")
    vs_floor = result.get("overhead_vs_floor_p99_ms", {}).get(f"{half}")
    vs_previous = result.get("runtime_ab", {}).get("max_rps_vs_previous")
    return {
        "speedup_vs_naive": round(max_rps / naive, 2) if naive else None,
        "max_rps_vs_forward_only": round(max_rps / forward_rps, 3) if forward_rps else None,
        "goals": {
            "max_rps >= 1000": max_rps >= GOAL_MAX_RPS,
            "max_rps >= 65% of forward-only": bool(forward_rps)
            and max_rps >= GOAL_SHARE_OF_FORWARD * forward_rps,
            "p99 <= 25 ms at 200 req/s": p99_200 is not None and p99_200 <= GOAL_P99_MS_AT_200,
            "p99 - echo p99 <= 10 ms at 200 req/s": overhead_200 is not None
            and overhead_200 <= GOAL_OVERHEAD_P99_MS,
            "max_rps >= 3x naive": bool(naive) and max_rps >= GOAL_SPEEDUP * naive,
            "max_rps >= 60% of forward-only": bool(forward_rps)
            and max_rps >= GOAL_SHARE_OF_FORWARD_RUNTIME * forward_rps,
            "p99 - floor p99 <= 15 ms at half max_rps": vs_floor is not None
            and vs_floor <= GOAL_VS_FLOOR_P99_MS,
            "max_rps >= 1.6x the previous scorer": None
            if vs_previous is None
            else vs_previous >= GOAL_VS_PREVIOUS,
        },
    }


def run_config(args: argparse.Namespace, settings: Settings, stack_kind: str) -> dict[str, Any]:
    return {
        "items": args.items, "candidates": args.candidates, "history": args.history,
        "users": args.users, "zipf": args.zipf, "saturation_requests": args.saturation_requests,
        "rate_seconds": args.rate_seconds, "batch_max": settings.scoring.batch_max,
        "batch_wait_ms": settings.scoring.batch_wait_ms, "torch_threads": settings.scoring.torch_threads,
        "workers": args.workers,
        "pipeline_depth": settings.scoring.pipeline_depth,
        "cpus": os.cpu_count(), "stack": stack_kind, "encoding": "int8",
        "redis": settings.redis.mode,
    }  # fmt: skip


FIGURES = (
    "max_rps",
    "naive_max_rps",
    "worker_cpu_ms_per_request.per_request",
    "latency.200.p50_ms",
    "latency.200.p99_ms",
    "redis_bytes_per_embedding_row",
    "redis_bytes_per_user_sequence",
)


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    if args.quick:
        _quick(args)
    if args.compare_cluster:

        def one(kind_settings: Settings, _work_dir: Path) -> dict[str, Any]:
            return asyncio.run(_run(args, kind_settings, "private"))

        return compare.compare_cluster(settings, one, runs=args.runs, figures=FIGURES)
    with bench_stack(settings) as (stack_settings, kind):
        return asyncio.run(_run(args, stack_settings, kind))
