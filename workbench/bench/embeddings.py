"""``streamrank bench embeddings``: Redis memory per row, cache hit rates, lookup latency, decode speed.

One run measures, on a real Redis (the settings' Redis if it answers, else a private one started
on a free port and stopped afterwards):

* ``bytes_per_row``: growth of Redis ``used_memory`` / rows while publishing ``--rows`` rows of
  each encoding (each under its own version, deleted after measuring), and
  ``key_bytes_per_row``: the table's keys' ``MEMORY USAGE`` / rows, which other clients of the
  same Redis cannot move;
* ``hit_rate``: a Zipf(``--zipf``) trace of ``--batches`` batches of ``--batch-size`` ids over
  ``--rows`` ids, cache capacity 1%, 5%, 10% of the table, for W-TinyLFU (ours), plain LRU and
  Belady's offline optimum on the same (per-batch deduplicated) trace;
* ``lookup``: p50/p99 of ``CachedEmbeddings.lookup`` per batch at 5% capacity, misses through
  Redis, after a warm-up, for both cache hold modes and both policies, plus the uncached store
  (script and pipeline fetch) as the baseline;
* ``decode_rows_per_s`` per encoding, on batch-sized decodes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from scoring.embeddings.cache import ENTRY_OVERHEAD_BYTES, CachedEmbeddings
from scoring.embeddings.codec import ENCODINGS, decode_rows, encode_rows, row_bytes
from scoring.embeddings.policy import belady_hits, make_policy
from scoring.embeddings.store import EmbeddingStore
from scoring.model.registry import delete_version
from streamrank import keys
from streamrank.redis.client import url_of, used_memory
from streamrank.settings import Settings
from workbench.devstack.servers import private_redis
from workbench.devstack.services import redis_answers

logger = logging.getLogger(__name__)

TARGET_BYTES_PER_ROW = {"int8": 64, "fp16": 96, "fp32": 160}
GOAL_HIT_RATE_POINTS_OVER_LRU = 3.0
GOAL_P99_US = 1000.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="table rows (and trace ids)")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batches", type=int, default=20_000, help="batches in the hit-rate trace")
    parser.add_argument("--batch-size", type=int, default=150)
    parser.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent of the trace")
    parser.add_argument(
        "--capacities", default="0.01,0.05,0.1", help="cache sizes as fractions of the table"
    )
    parser.add_argument(
        "--latency-batches", type=int, default=3000, help="timed lookups (after as many warm-up)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--private-redis",
        action="store_true",
        help="always start a private Redis (default: use the settings' Redis if it answers)",
    )


# --- Redis for the run ---------------------------------------------------------------------


@contextlib.contextmanager
def bench_redis(settings: Settings, *, private: bool) -> Iterator[tuple[str, bool]]:
    """``(url, started_here)``: the settings' Redis if it answers, else a private one."""
    if not private and redis_answers(settings.redis.dsn):
        yield url_of(settings.redis), False
        return
    with (
        tempfile.TemporaryDirectory(prefix="sr-bench-emb-") as run_dir,
        private_redis(Path(run_dir), persist="none") as server,
    ):
        logger.info(
            "started a private Redis on port %s (pid %s)",
            server.port,
            server.proc.pid if server.proc else None,
        )
        yield server.url, True


@contextlib.asynccontextmanager
async def _store(url: str, **kwargs: Any) -> AsyncIterator[EmbeddingStore]:
    async with EmbeddingStore.from_url(url, **kwargs) as store:
        yield store


# --- pure parts ----------------------------------------------------------------------------


def zipf_trace(
    n_ids: int, batches: int, batch_size: int, exponent: float, seed: int
) -> npt.NDArray[np.int64]:
    """``int64[batches, batch_size]`` ids in ``[0, n_ids)``, rank r drawn with p ~ 1 / r^exponent.

    Ranks are mapped to ids through a random permutation, so popular ids are spread out.
    """
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_ids + 1, dtype=np.float64) ** exponent  # [n_ids]
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(batches * batch_size), side="right")  # [b * s]
    ranks = np.minimum(ranks, n_ids - 1)
    perm = rng.permutation(n_ids)
    return perm[ranks].reshape(batches, batch_size).astype(np.int64)


def dedupe_batches(trace: npt.NDArray[np.int64]) -> list[list[int]]:
    """Each batch's distinct ids in first-seen order (what the cache sees after dedupe)."""
    return [list(dict.fromkeys(row)) for row in trace.tolist()]


def simulate(policy_name: str, batches: list[list[int]], capacity: int) -> float:
    """Hit rate of a policy (unit sizes, ``capacity`` entries) over deduplicated batches."""
    policy = make_policy(
        policy_name, capacity=capacity, size_of=_unit, expected_entries=max(16, capacity)
    )
    hits = total = 0
    for batch in batches:
        got = policy.get_many(batch)
        miss = [k for k, v in zip(batch, got, strict=True) if v is None]
        hits += len(batch) - len(miss)
        total += len(batch)
        policy.put_many(miss, [True] * len(miss))
    return hits / total if total else 0.0


def _unit(_: object) -> int:
    return 1


def percentiles_us(samples: list[float]) -> dict[str, float]:
    arr = np.asarray(samples) * 1e6
    return {
        "p50_us": round(float(np.percentile(arr, 50)), 1),
        "p99_us": round(float(np.percentile(arr, 99)), 1),
        "mean_us": round(float(arr.mean()), 1),
    }


def decode_rate(encoding: str, dim: int, batch: int, seed: int) -> float:
    """Rows per second decoding ``batch``-row batches (bytes -> float32), best of 5 runs."""
    m = np.random.default_rng(seed).standard_normal((batch, dim)).astype(np.float32)
    encoded = encode_rows(m, encoding)
    blob = encoded.tobytes()
    width = row_bytes(encoding, dim)
    reps = max(1, 200_000 // batch)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(reps):
            decode_rows(np.frombuffer(blob, dtype=np.uint8).reshape(-1, width), encoding, dim)
        best = min(best, time.perf_counter() - started)
    return reps * batch / best


# --- the run -------------------------------------------------------------------------------


async def _memory(url: str, rows: int, dim: int, seed: int) -> dict[str, Any]:
    """bytes_per_row per encoding; leaves the int8 table published for the latency part."""
    ids = [str(i) for i in range(rows)]
    matrix = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    out: dict[str, Any] = {"bytes_per_row": {}, "key_bytes_per_row": {}, "publish_s": {},
                           "buckets": {}}  # fmt: skip
    keep = ""
    async with _store(url) as store:
        client = store.redis
        for enc in ("int8", "fp16", "fp32"):
            version = f"bench-{enc}-{uuid.uuid4().hex[:8]}"
            before = await used_memory(client)
            report = await store.publish("item", ids, matrix, encoding=enc, version=version)
            after = await used_memory(client)
            out["bytes_per_row"][enc] = round((after - before) / rows, 1)
            out["key_bytes_per_row"][enc] = round(await _table_bytes(client, version) / rows, 1)
            out["publish_s"][enc] = round(report.seconds, 1)
            out["buckets"][enc] = {
                "count": report.buckets,
                "max_rows": report.max_bucket_rows,
                "compact": report.compact,
            }
            if enc == "int8":
                keep = version
            else:
                await delete_version(store, version)
        # The same int8 table with longer, non-numeric ids (Redis stores numeric ids as integers).
        version = f"bench-int8s-{uuid.uuid4().hex[:8]}"
        named = [f"item-{i:09d}" for i in range(rows)]
        before = await used_memory(client)
        await store.publish("item", named, matrix, encoding="int8", version=version)
        after = await used_memory(client)
        out["bytes_per_row_int8_string_ids"] = round((after - before) / rows, 1)
        await delete_version(store, version)
    out["latency_version"] = keep
    return out


async def _table_bytes(client: Any, version: str) -> int:
    """The ``MEMORY USAGE`` (every nested value counted) of the version's item table keys."""
    total = 0
    async for key in client.scan_iter(match=keys.embedding_table_pattern(version, "item"),
                                      count=1000):  # fmt: skip
        total += int(await client.memory_usage(key, samples=0) or 0)
    return total


def _hit_rates(
    trace: npt.NDArray[np.int64], rows: int, fractions: list[float]
) -> dict[str, dict[str, float]]:
    batches = dedupe_batches(trace)
    flat = np.fromiter((k for b in batches for k in b), dtype=np.int64)
    out: dict[str, dict[str, float]] = {}
    for frac in tqdm(fractions, desc="hit-rate simulations", unit="capacity"):
        cap = max(1, int(rows * frac))
        ours = simulate("tinylfu", batches, cap)
        lru = simulate("lru", batches, cap)
        opt = belady_hits(flat, cap) / len(flat)
        out[f"{frac:g}"] = {
            "ours_tinylfu": round(ours, 4),
            "lru": round(lru, 4),
            "belady": round(opt, 4),
            "ours_minus_lru_points": round(100 * (ours - lru), 2),
        }
    return out


async def _time_interleaved(
    calls: dict[str, Callable[[list[str]], Any]], batches: list[list[str]], warm: int
) -> dict[str, dict[str, float]]:
    """Per-batch latency of each call, the calls taking turns on every batch in rotating order
    (so background noise on a shared machine hits all of them alike); the first ``warm``
    batches untimed.

    Besides wall time, ``cpu_*`` is this thread's CPU time per call: the client's own work,
    without the time Redis takes or the time the OS gives to other processes.
    """
    samples: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls.items())
    for k, batch in enumerate(tqdm(batches, desc="lookups", unit="batch")):
        # Rotate who goes first: the first call after the progress bar's update pays for it.
        shift = k % len(order)
        for name, call in order[shift:] + order[:shift]:
            started, started_cpu = time.perf_counter(), time.thread_time()
            await call(batch)
            if k >= warm:
                samples[name].append(time.perf_counter() - started)
                cpu[name].append(time.thread_time() - started_cpu)
    out = {}
    for name in calls:
        out[name] = percentiles_us(samples[name])
        cpu_us = percentiles_us(cpu[name])
        out[name].update({"cpu_p50_us": cpu_us["p50_us"], "cpu_p99_us": cpu_us["p99_us"]})
    return out


def _cached_lookup(emb: CachedEmbeddings, version: str) -> Callable[[list[str]], Any]:
    return lambda batch: emb.lookup(version, "item", batch)


async def _latency(
    url: str, version: str, trace: npt.NDArray[np.int64], rows: int, n: int, dim: int
) -> dict[str, Any]:
    """Lookup latency per batch at 5% capacity (misses through Redis), after ``n`` warm-up batches."""
    str_batches = [[str(i) for i in row] for row in trace[: 2 * n].tolist()]
    capacity_rows = int(rows * 0.05)
    out: dict[str, Any] = {"capacity_rows": capacity_rows, "batch_size": trace.shape[1]}
    # The same byte budget for every cache: 5% of the table's rows held encoded.
    budget = capacity_rows * (row_bytes("int8", dim) + ENTRY_OVERHEAD_BYTES)
    out["cache_bytes"] = budget
    async with (
        _store(url) as store,
        _store(url, fetch_mode="pipeline") as piped,
    ):
        await store.table_meta(version, "item")
        await piped.table_meta(version, "item")
        caches = {
            f"cached_{policy}_{hold}": CachedEmbeddings(
                store=store,
                cache_bytes=budget,
                policy=policy,
                hold=hold,  # type: ignore[arg-type]
            )
            for policy, hold in (("tinylfu", "encoded"), ("tinylfu", "decoded"), ("lru", "encoded"))
        }
        calls = {name: _cached_lookup(emb, version) for name, emb in caches.items()}
        calls["uncached_store_script"] = lambda b: store.lookup("item", b, version=version)
        # The noise floor: one PING per batch, same client, same moment.
        calls["redis_ping_baseline"] = lambda b: store.redis.ping()
        # Set-up garbage (the 1M-id lists, the trace) is frozen out of the collector's scans,
        # as a long-running worker does after start-up (gc.freeze); the collector still runs.
        gc.collect()
        gc.freeze()
        try:
            out.update(await _time_interleaved(calls, str_batches, warm=n))
            out.update(
                await _time_interleaved(
                    {"uncached_store_pipeline": lambda b: piped.lookup("item", b, version=version)},
                    str_batches[: min(len(str_batches), 300)],
                    warm=20,
                )
            )
        finally:
            gc.unfreeze()
        for name, emb in caches.items():
            stats = emb.stats()
            out[name]["entries"] = stats["entries"]
            out[name]["hit_ratio_overall"] = round(stats["hit_ratio"], 4)
    return out


async def _run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    fractions = [float(x) for x in args.capacities.split(",") if x.strip()]
    started = time.perf_counter()
    memory = await _memory(url, args.rows, args.dim, args.seed)
    version = memory.pop("latency_version")
    trace = zipf_trace(args.rows, args.batches, args.batch_size, args.zipf, args.seed)
    try:
        hit_rate = _hit_rates(trace, args.rows, fractions)
        lat_trace = zipf_trace(
            args.rows, 2 * args.latency_batches, args.batch_size, args.zipf, args.seed + 1
        )
        latency = await _latency(url, version, lat_trace, args.rows, args.latency_batches, args.dim)
    finally:
        async with _store(url) as store:
            await delete_version(store, version)
    decode = {
        enc: round(decode_rate(enc, args.dim, args.batch_size, args.seed)) for enc in ENCODINGS
    }
    ours = latency["cached_tinylfu_encoded"]
    first = hit_rate[f"{fractions[0]:g}"] if fractions else {}
    goals = {
        **{
            f"bytes_per_row_{enc}<={target}": memory["bytes_per_row"][enc] <= target
            for enc, target in TARGET_BYTES_PER_ROW.items()
        },
        f"hit_rate_at_{fractions[0]:g}_ours>=lru+3pts": (
            first.get("ours_minus_lru_points", 0.0) >= GOAL_HIT_RATE_POINTS_OVER_LRU
        ),
        f"lookup_p99_us<={GOAL_P99_US:g}": ours["p99_us"] <= GOAL_P99_US,
    }
    return {
        "rows": args.rows,
        "dim": args.dim,
        "zipf": args.zipf,
        "trace_batches": args.batches,
        "batch_size": args.batch_size,
        **memory,
        "hit_rate": hit_rate,
        "lookup_p50_us": ours["p50_us"],
        "lookup_p99_us": ours["p99_us"],
        "lookup": latency,
        "decode_rows_per_s": decode,
        "goals_met": goals,
        "seconds": round(time.perf_counter() - started, 1),
    }


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    with bench_redis(settings, private=args.private_redis) as (url, private):
        result = asyncio.run(_run(args, url))
    result["redis"] = "private (started for this run)" if private else "settings' Redis"
    return result
