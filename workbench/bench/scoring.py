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
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from tqdm import tqdm

from scoring.serving.assemble import assemble, gather
from scoring.serving.service import forward
from scoring.serving.worker import configure_torch
from streamrank import clock, keys
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client, used_memory
from streamrank.settings import Settings
from workbench.bench import compare
from workbench.bench.cpu import host_busy_seconds, process_cpu_seconds
from workbench.bench.loadgen import Driver, make_requests, zipf_ids
from workbench.devstack import processes
from workbench.devstack.processes import ChildProcess, start_child

logger = logging.getLogger(__name__)

GOAL_MAX_RPS = 1000.0
GOAL_SHARE_OF_FORWARD = 0.65
GOAL_P99_MS_AT_200 = 25.0
GOAL_OVERHEAD_P99_MS = 10.0
GOAL_SPEEDUP = 3.0


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
    redis: aioredis.Redis, *, n_items: int, seed: int, version: str, workdir: Path
) -> tuple[Any, np.ndarray]:
    """A random-weight DIN and item table, saved as an artifact and published; returns the
    scorer and the float32 item table (row n = id ``i{n}``)."""
    import torch

    from scoring.model.artifact import load_artifact, save_artifact
    from scoring.model.din import DIN, ModelSpec, dense_state
    from scoring.model.registry import publish_artifact

    spec = ModelSpec()
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
        feature_spec={"synthetic": True},
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


async def warm_up(driver: Driver, requests: list[tuple[str, str, list[str]]]) -> None:
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


# --- measurements -----------------------------------------------------------------------------


def forward_only(
    scorer: Any,
    table: np.ndarray,
    requests: list[tuple[str, str, list[str]]],
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


async def _run(args: argparse.Namespace, base: Settings, stack_kind: str) -> dict[str, Any]:
    from scoring.embeddings.store import EmbeddingStore
    from scoring.model.registry import delete_version

    tag = uuid.uuid4().hex[:8]
    version = f"bench-din-{tag}"
    settings = base.with_env(
        STREAMRANK_TOPIC_REQUESTS=f"bench-rank-requests-{tag}",
        STREAMRANK_TOPIC_RESULTS=f"bench-rank-results-{tag}",
        STREAMRANK_TOPIC_DEAD_LETTERS=f"bench-dead-letters-{tag}",
        STREAMRANK_SEQUENCE_LENGTH=args.history,
    )
    naive_settings = phase_settings(settings, "naive")
    await create_topics(settings, topics=(settings.topics.dead_letters,
                                          *phase_topics(naive_settings)))  # fmt: skip
    redis = redis_client(settings.redis, timeout_s=30)
    timings: dict[str, float] = {}
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    n_rate = sum(int(r * args.rate_seconds) for r in rates)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    settle = 200 * len(modes) if args.workers > 1 else 0  # the extra warm-up of several workers
    # every mode's warm-up and saturation, the echo's (warm-up, saturation, the rates), the naive's
    total = (200 * (len(modes) + 1) + settle + args.saturation_requests * (len(modes) + 1)
             + 2 * n_rate + args.naive_requests + 50)  # fmt: skip
    t0 = time.perf_counter()
    requests = make_requests(n=total, users=args.users, n_items=args.items,
                             candidates=args.candidates, zipf_a=args.zipf, seed=args.seed)  # fmt: skip
    requests = [(rid, f"b{tag}{user}", items) for rid, user, items in requests]
    rng = np.random.default_rng(args.seed + 1)
    hist_items = zipf_ids(rng, args.users * args.history, n_items=args.items, a=args.zipf)
    hist_items = hist_items.reshape(args.users, args.history)
    histories = {f"b{tag}u{u}": [f"i{int(x)}" for x in hist_items[u]] for u in range(args.users)}
    timings["traffic_s"] = round(time.perf_counter() - t0, 1)
    store = EmbeddingStore(redis=redis)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="streamrank-bench-model-") as workdir:
        try:
            t0 = time.perf_counter()
            memory = await used_memory(redis)
            scorer, table = await publish_synthetic(
                redis, n_items=args.items, seed=args.seed, version=version, workdir=Path(workdir)
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
            result = await _measure(args, settings, naive_settings, version, requests, modes,
                                    rates)  # fmt: skip
            configure_torch(settings.scoring)  # the same thread settings as the worker
            fwd = forward_only(scorer, table, requests[:512], histories,
                               batch=settings.scoring.batch_max)  # fmt: skip
            result["forward_only_rps"] = max(fwd.values())
            result["forward_only_rps_by_mode"] = fwd
            # used_memory (summed over masters) grown by the int8 item table (its rows, bucket
            # keys, shard publish ids; the model's dense weights too) and by the sequences
            result["redis_bytes_per_embedding_row"] = round(bytes_per_row, 1)
            result["redis_bytes_per_user_sequence"] = round(bytes_per_user, 1)
        finally:
            with contextlib.suppress(Exception):
                await delete_version(store, version, force=True)
                await delete_version(store, f"{version}-fp32", force=True)
                await redis.delete(keys.model_dense(version), keys.model_config(version))
                user_keys = [keys.sequence(u) for u in histories]
                for i in range(0, len(user_keys), 1000):
                    await redis.delete(*user_keys[i : i + 1000])
            await redis.aclose()
    max_rps = result.get("max_rps", 0.0)
    naive = result.get("naive_max_rps", 0.0)
    p99_200 = result.get("latency", {}).get("200", {}).get("p99_ms")
    forward_rps = result.get("forward_only_rps", 0.0)
    overhead_200 = result.get("overhead_p99_ms", {}).get("200")
    result["speedup_vs_naive"] = round(max_rps / naive, 2) if naive else None
    result["max_rps_vs_forward_only"] = round(max_rps / forward_rps, 3) if forward_rps else None
    result["goals"] = {
        "max_rps >= 1000": max_rps >= GOAL_MAX_RPS,
        "max_rps >= 65% of forward-only": bool(forward_rps)
        and max_rps >= GOAL_SHARE_OF_FORWARD * forward_rps,
        "p99 <= 25 ms at 200 req/s": p99_200 is not None and p99_200 <= GOAL_P99_MS_AT_200,
        "p99 - echo p99 <= 10 ms at 200 req/s": overhead_200 is not None
        and overhead_200 <= GOAL_OVERHEAD_P99_MS,
        "max_rps >= 3x naive": bool(naive) and max_rps >= GOAL_SPEEDUP * naive,
    }
    result["config"] = {
        "items": args.items, "candidates": args.candidates, "history": args.history,
        "users": args.users, "zipf": args.zipf, "saturation_requests": args.saturation_requests,
        "rate_seconds": args.rate_seconds, "batch_max": settings.scoring.batch_max,
        "batch_wait_ms": settings.scoring.batch_wait_ms, "torch_threads": settings.scoring.torch_threads,
        "workers": args.workers,
        "pipeline_depth": settings.scoring.pipeline_depth,
        "cpus": os.cpu_count(), "stack": stack_kind, "encoding": "int8",
        "redis": settings.redis.mode,
    }  # fmt: skip
    result["setup"] = timings
    return result


async def _measure(
    args: argparse.Namespace,
    settings: Settings,
    naive_settings: Settings,
    version: str,
    requests: list[tuple[str, str, list[str]]],
    modes: list[str],
    rates: list[float],
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "max_rps_by_forward": {},
        "worker_cpu_ms_per_request": {},
        "latency": {},
        "degraded_replies": 0,
    }
    cursor = 0

    def take(n: int) -> list[tuple[str, str, list[str]]]:
        nonlocal cursor
        chunk = requests[cursor : cursor + n]
        cursor += n
        return chunk

    cli = [sys.executable, "-m", "workbench.cli", "worker", "scoring", "--metrics-port", "0"]
    for n, mode in enumerate(modes):
        mode_settings = phase_settings(settings, mode)
        await create_topics(mode_settings, topics=phase_topics(mode_settings))
        env = worker_env(mode_settings, STREAMRANK_CANARY_SPLIT=f"{version}:1",
                         STREAMRANK_SCORING_FORWARD=mode,
                         STREAMRANK_SCORING_GROUP_ID=f"bench-scoring-{version}-{mode}")  # fmt: skip
        with contextlib.ExitStack() as workers:
            procs = [workers.enter_context(worker_process(cli, env)) for _ in range(args.workers)]
            async with Driver(settings=settings, requests_topic=mode_settings.topics.requests,
                              results_topic=mode_settings.topics.results) as driver:  # fmt: skip
                await warm_up(driver, take(200))
                if args.workers > 1:
                    # The first reply came from the first worker to join; the others' joins
                    # rebalance the group (Tansu pads each join ~3 s): let it settle first.
                    await asyncio.sleep(10)
                    await driver.open_loop(take(200), rate=200.0, drain_s=30.0)
                cpu0 = sum(process_cpu_seconds(p.pid) for p in procs)
                loadgen, host0, wall0 = LoadgenCpu(), host_busy_seconds(), time.perf_counter()
                rps, stats = await driver.saturate(take(args.saturation_requests))
                out.setdefault("saturation_loadgen_cpu_percent", {})[mode] = loadgen.percent()
                out.setdefault("saturation_host_busy_cores", {})[mode] = round(
                    (host_busy_seconds() - host0) / (time.perf_counter() - wall0), 2
                )
                cpu1 = sum(process_cpu_seconds(p.pid) for p in procs)
                cpu_ms = (cpu1 - cpu0) * 1000 / max(1, len(stats.got))
                out["worker_cpu_ms_per_request"][mode] = round(cpu_ms, 2)
                out.setdefault("saturation_stage_ms_mean", {})[mode] = stats.summary().get(
                    "worker_stage_ms_mean"
                )
                out["degraded_replies"] += stats.degraded
                out["max_rps_by_forward"][mode] = round(rps, 1)
                logger.info("forward %s: max_rps %.1f (%s)", mode, rps, stats.summary())
                if n == 0:  # latency with the first mode
                    out["latency"] = await latency_at(driver, take, rates, args.rate_seconds)
                    out["degraded_replies"] += sum(v["degraded"] for v in out["latency"].values())
        if n == 0:  # the floor right after: the broker and the host as close as they get
            out["echo"] = await _measure_echo(args, settings, version, take, rates)
    best = max(out["max_rps_by_forward"], key=out["max_rps_by_forward"].get)
    out["max_rps"] = out["max_rps_by_forward"][best]
    out["max_rps_forward_mode"] = best
    out["overhead_p99_ms"] = {
        rate: round(ours["p99_ms"] - out["echo"]["latency"][rate]["p99_ms"], 2)
        for rate, ours in out["latency"].items()
        if "p99_ms" in ours and "p99_ms" in out["echo"]["latency"].get(rate, {})
    }
    naive_cli = [sys.executable, "-m", "workbench.bench.naive"]
    env = worker_env(naive_settings, STREAMRANK_BENCH_NAIVE_VERSION=f"{version}-fp32",
                     STREAMRANK_BENCH_MODEL_VERSION=version,
                     STREAMRANK_SCORING_GROUP_ID=f"bench-naive-{version}")  # fmt: skip
    with worker_process(naive_cli, env) as proc:
        async with Driver(settings=naive_settings, requests_topic=naive_settings.topics.requests,
                          results_topic=naive_settings.topics.results) as driver:  # fmt: skip
            await warm_up(driver, take(10))
            cpu0 = process_cpu_seconds(proc.pid)
            rps, stats = await driver.saturate(take(args.naive_requests))
            cpu_ms = (process_cpu_seconds(proc.pid) - cpu0) * 1000 / max(1, len(stats.got))
            out["worker_cpu_ms_per_request"]["naive"] = round(cpu_ms, 2)
            out["naive_max_rps"] = round(rps, 1)
            logger.info("naive: max_rps %.1f (%s)", rps, stats.summary())
    return out


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


async def latency_at(
    driver: Driver, take: Any, rates: list[float], seconds: float
) -> dict[str, dict[str, Any]]:
    """p50/p99 at each offered rate, with the load generator's own CPU (% of one core)."""
    out: dict[str, dict[str, Any]] = {}
    for rate in rates:
        loadgen = LoadgenCpu()
        stats = await driver.open_loop(take(int(rate * seconds)), rate=rate)
        summary = stats.summary()
        summary["loadgen_cpu_percent"] = loadgen.percent()
        out[f"{rate:g}"] = summary
        logger.info("offered %s req/s: %s", rate, summary)
    return out


async def _measure_echo(
    args: argparse.Namespace, settings: Settings, version: str, take: Any, rates: list[float]
) -> dict[str, Any]:
    """The floor: the echo worker (:mod:`workbench.bench.echo`) on its own request topic,
    saturated then at the same offered rates."""
    echo_settings = phase_settings(settings, "echo").with_env(
        STREAMRANK_SCORING_GROUP_ID=f"bench-echo-{version}"
    )
    await create_topics(echo_settings, topics=phase_topics(echo_settings))
    cli = [sys.executable, "-m", "workbench.bench.echo"]
    with worker_process(cli, worker_env(echo_settings)) as proc:
        async with Driver(settings=echo_settings, requests_topic=echo_settings.topics.requests,
                          results_topic=echo_settings.topics.results) as driver:  # fmt: skip
            await warm_up(driver, take(200))
            cpu0 = process_cpu_seconds(proc.pid)
            loadgen = LoadgenCpu()
            rps, stats = await driver.saturate(take(args.saturation_requests))
            cpu_ms = (process_cpu_seconds(proc.pid) - cpu0) * 1000 / max(1, len(stats.got))
            logger.info("echo: max_rps %.1f (%s)", rps, stats.summary())
            return {
                "max_rps": round(rps, 1),
                "worker_cpu_ms_per_request": round(cpu_ms, 3),
                "saturation_loadgen_cpu_percent": loadgen.percent(),
                "latency": await latency_at(driver, take, rates, args.rate_seconds),
            }


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
