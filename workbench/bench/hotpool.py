"""``streamrank bench hotpool``: what one refresh of the hot-item pool costs, on a catalogue.

A private Redis (memory only, on a free port, stopped afterwards) gets the item counter buckets
of one synthetic day before the as-of time: ``--clicks`` clicks over a Zipf(``--zipf``)
catalogue of ``--items`` items, spread evenly over the day's coarse buckets, and the last
hour's also over its fine buckets. Then, for each window (``--window``: 24h, 1h or both):

* ``full``: the whole window read and summed (``streams.hot_items.read_hot_items``): ms per
  refresh and the bytes Redis sent;
* ``incremental``: ``HotItemsReader`` as the pool uses it: its first read, then
  ``--refreshes`` refreshes (each reads the buckets it lacks and ``--resync`` more): ms,
  buckets and bytes per refresh, the longest event-loop stall while refreshing, and the memory
  it holds (tracemalloc, in a pass of its own).

Both must answer the same top ``--pool`` (checked). Times are wall clock on this host, Redis on
the same host.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from streamrank import keys
from streamrank.settings import Settings
from streams.hot_items import HotItemsReader, read_hot_items
from streams.windows import Window, closed_buckets, windows_from_settings
from workbench.devstack.servers import private_redis

AS_OF_MS = 1_800_000_000_000  # an hour boundary; the buckets carry no expiry here


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--items", type=int, default=1_000_000, help="catalogue size")
    parser.add_argument(
        "--clicks",
        type=int,
        default=920_000,
        help="clicks in the day (default: about 200,000 distinct items of 1M at Zipf 1.0)",
    )
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of popularity")
    parser.add_argument("--window", choices=("24h", "1h", "both"), default="both")
    parser.add_argument("--pool", type=int, default=500, help="items in the pool")
    parser.add_argument("--refreshes", type=int, default=20, help="timed steady refreshes")
    parser.add_argument("--resync", type=int, default=2, help="buckets re-read per refresh")
    parser.add_argument("--seed", type=int, default=7)


def day_of_clicks(
    args: argparse.Namespace, coarse: Window, *, as_of_ms: int = AS_OF_MS
) -> list[tuple[int, np.ndarray]]:
    """Per coarse bucket of the day before the as-of time, the clicked items (indices, one per
    click): Zipf over a shuffled catalogue."""
    rng = np.random.default_rng(args.seed)
    weights = 1.0 / np.arange(1, args.items + 1) ** args.zipf
    weights /= weights.sum()
    by_rank = rng.permutation(args.items)
    starts = list(closed_buckets(as_of_ms, coarse))
    per = args.clicks // len(starts)
    return [(s, by_rank[rng.choice(args.items, size=per, p=weights)]) for s in starts]


async def write_buckets(
    redis: Any, res: int, start: int, clicked: np.ndarray, names: Sequence[str] | None = None
) -> int:
    """HSET one bucket's counts into its shards' hashes; the fields written. Item k is
    ``names[k]`` (default ``i{k}``)."""
    items, counts = np.unique(clicked, return_counts=True)
    ids = [f"i{k}" if names is None else names[k] for k in items.tolist()]
    shards = np.array([zlib.crc32(i.encode()) % keys.ITEM_COUNTER_SHARDS for i in ids])
    pipe = redis.pipeline(transaction=False)
    for shard in range(keys.ITEM_COUNTER_SHARDS):
        mine = np.flatnonzero(shards == shard).tolist()
        if mine:
            mapping = {ids[p]: int(counts[p]) for p in mine}
            pipe.hset(keys.item_counter_bucket(shard, res, start), mapping=mapping)
    await pipe.execute()
    return len(ids)


async def populate(
    redis: Any,
    args: argparse.Namespace,
    fine: Window,
    coarse: Window,
    *,
    as_of_ms: int = AS_OF_MS,
    names: Sequence[str] | None = None,
) -> dict[str, int]:
    """The day's clicks before ``as_of_ms`` in the item counter buckets (item k named
    ``names[k]``, default ``i{k}``); the fields written per window."""
    rng = np.random.default_rng(args.seed + 1)
    fields = {"24h": 0, "1h": 0}
    last_hour = list(closed_buckets(as_of_ms, fine))
    for start, clicked in day_of_clicks(args, coarse, as_of_ms=as_of_ms):
        fields["24h"] += await write_buckets(redis, coarse.resolution_s, start, clicked, names)
        inside = [f for f in last_hour if start <= f < start + coarse.resolution_s]
        if inside:  # the last hour: its clicks in the fine buckets too
            slot = rng.integers(0, len(inside), size=len(clicked))
            for k, fine_start in enumerate(inside):
                part = clicked[slot == k]
                fields["1h"] += await write_buckets(
                    redis, fine.resolution_s, fine_start, part, names
                )
    return fields


async def sent_bytes(redis: Any) -> int:
    return int((await redis.info("stats"))["total_net_output_bytes"])


async def timed(redis: Any, call: Callable[[], Awaitable[Any]]) -> tuple[Any, float, int, float]:
    """``call``'s result, wall ms, bytes Redis sent meanwhile, and the longest event-loop
    stall (ms) a 1 ms ticker saw while it ran."""
    stall = 0.0
    done = False

    async def ticker() -> None:
        nonlocal stall
        while not done:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            stall = max(stall, (time.perf_counter() - t - 0.001) * 1000)

    tick = asyncio.create_task(ticker())
    before = await sent_bytes(redis)
    started = time.perf_counter()
    result = await call()
    ms = (time.perf_counter() - started) * 1000
    done = True
    await tick
    return result, ms, await sent_bytes(redis) - before, stall


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "max": round(max(values), 2)}


async def one_window(
    redis: Any,
    args: argparse.Namespace,
    settings: Settings,
    window: Window,
    *,
    as_of_ms: int = AS_OF_MS,
) -> dict[str, Any]:
    """A whole read of ``window`` and the incremental reader's first read and refreshes, as of
    ``as_of_ms``: times, bytes, loop stalls and the memory the reader holds."""
    full = [await timed(redis, lambda: read_hot_items(redis, window, as_of_ms=as_of_ms, n=args.pool))
            for _ in range(3)]  # fmt: skip
    top = full[0][0]
    reader = HotItemsReader(redis=redis, features=settings.features, resync=args.resync)
    first = await timed(
        redis, lambda: reader.hot_items(window.name, as_of_ms=as_of_ms, n=args.pool)
    )
    steady = []
    for _ in range(args.refreshes):
        steady.append(
            await timed(
                redis, lambda: reader.hot_items(window.name, as_of_ms=as_of_ms, n=args.pool)
            )
        )
    assert all(r[0] == top for r in (*full, first, *steady)), "the two reads disagree"
    tracemalloc.start()
    held = HotItemsReader(redis=redis, features=settings.features, resync=args.resync)
    await held.hot_items(window.name, as_of_ms=as_of_ms, n=args.pool)
    memory, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    buckets = len(closed_buckets(as_of_ms, window))
    return {
        "buckets": buckets,
        "full": {
            "ms": summary([r[1] for r in full]),
            "bytes": full[0][2],
            "loop_stall_ms": summary([r[3] for r in full]),
        },
        "incremental": {
            "first_ms": round(first[1], 2),
            "first_bytes": first[2],
            "first_loop_stall_ms": round(first[3], 2),
            "ms": summary([r[1] for r in steady]),
            "bytes": summary([float(r[2]) for r in steady]),
            "loop_stall_ms": summary([r[3] for r in steady]),
            "buckets_per_refresh": args.resync,
            "held_mb": round(memory / 1e6, 1),
        },
        "top_3": top[:3],
    }


async def _bench(url: str, args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    fine, coarse = windows_from_settings(settings.features)
    redis = aioredis.from_url(url, socket_timeout=30)
    try:
        started = time.perf_counter()
        fields = await populate(redis, args, fine, coarse)
        out: dict[str, Any] = {
            "catalogue": args.items,
            "clicks_per_day": args.clicks,
            "zipf": args.zipf,
            "bucket_fields": fields,
            "populate_s": round(time.perf_counter() - started, 1),
            "redis_used_memory_mb": round((await redis.info("memory"))["used_memory"] / 1e6, 1),
        }
        windows = (
            [coarse, fine]
            if args.window == "both"
            else [w for w in (coarse, fine) if w.name == args.window]
        )
        for window in windows:
            totals = await read_hot_items(redis, window, as_of_ms=AS_OF_MS, n=10**9)
            out[window.name] = {
                "items_clicked": len(totals),
                **await one_window(redis, args, settings, window),
            }
        return out
    finally:
        await redis.aclose()


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="sr-bench-hot-", ignore_cleanup_errors=True) as tmp,
        private_redis(Path(tmp), persist="none") as server,
    ):
        return asyncio.run(_bench(server.url, args, settings))
