"""The hot items: the most clicked items of an item-counter window, as of a time.

A window's clicks per item are the item counter buckets of :func:`streams.windows.closed_buckets`
(``sr:{i:<shard>}:cnt:<res>:<start>``, field = item id, value = clicks), summed over every
shard: the point-in-time rule of every counter, so a click in a bucket that has not closed at
the as-of time is not counted. The order is by clicks, best first, ties by item id.

- :func:`read_hot_items` reads the whole window: one ``HGETALL`` per (shard, bucket), one
  round trip. What the command line and tests use.
- :class:`HotItemsReader` answers the same question again and again (the scoring worker's
  hot-item pool, every few seconds) without reading the whole window each time: it keeps each
  closed bucket's counts (:class:`WindowTotals`) and reads only the buckets it does not hold
  yet (all of them the first time, then the one that closes each bucket period) plus the
  ``resync`` it read longest ago, so a late click into a closed bucket shows within
  ``buckets / resync`` calls. A whole window of a large catalogue is too much to read and sum
  on a scoring worker's event loop every few seconds; a bucket or two is not (measured in
  docs/scoring.md, "Hot-item pool").
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from streamrank import keys
from streamrank.redis.errors import redis_call
from streamrank.redis.pipeline import NodePipeline
from streamrank.settings import FeatureSettings
from streams.windows import Window, closed_buckets, windows_from_settings

HotItem = tuple[str, int]  # (item id, clicks in the window)
_SHARDS = range(keys.ITEM_COUNTER_SHARDS)


def top_n(ids: Sequence[bytes], counts: np.ndarray, n: int) -> list[HotItem]:
    """The ``n`` items with the most clicks, best first, ties by id; items without clicks are
    left out. ``ids`` are UTF-8 bytes (their byte order is the ids' code point order), aligned
    with ``counts``."""
    counts = np.asarray(counts, dtype=np.int64)  # [M]
    if n <= 0 or not len(counts):
        return []
    floor = 1
    if len(counts) > n:  # the n-th largest count: only counts at or above it can make the cut
        floor = max(1, int(np.partition(counts, len(counts) - n)[len(counts) - n]))
    positions = np.flatnonzero(counts >= floor)
    values = counts[positions].tolist()
    ranked = sorted(zip(values, positions.tolist(), strict=True), key=lambda p: (-p[0], ids[p[1]]))
    return [(ids[pos].decode(), value) for value, pos in ranked[:n]]


class WindowTotals:
    """Clicks per item summed over the buckets it holds (pure: no I/O).

    Item ids are interned to positions; each bucket is kept as (positions, counts) arrays and
    the totals as one int64 array, so replacing a bucket costs its own size, not the window's.
    """

    def __init__(self) -> None:
        self._index: dict[bytes, int] = {}
        self._ids: list[bytes] = []
        self._totals = np.zeros(0, dtype=np.int64)  # [M], aligned with _ids
        self._buckets: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # start -> (pos, counts)
        self._read: dict[int, int] = {}  # start -> the read number that last refreshed it
        self._reads = 0

    def held(self) -> list[int]:
        """Starts of the buckets held, oldest first."""
        return sorted(self._buckets)

    def keep(self, starts: Iterable[int]) -> None:
        """Drop every bucket not in ``starts`` (the ones that left the window)."""
        wanted = set(starts)
        for start in [s for s in self._buckets if s not in wanted]:
            positions, counts = self._buckets.pop(start)
            np.subtract.at(self._totals, positions, counts)
            del self._read[start]

    def stalest(self, k: int, *, besides: Iterable[int] = ()) -> list[int]:
        """Up to ``k`` held buckets (not in ``besides``) read longest ago."""
        skip = set(besides)
        held = [s for s in self._buckets if s not in skip]
        return sorted(held, key=lambda s: (self._read[s], s))[: max(0, k)]

    def put(self, start: int, replies: Iterable[Any]) -> None:
        """Set bucket ``start`` to the sum of ``replies`` (its shards' ``HGETALL`` replies)."""
        index, ids = self._index, self._ids
        names: list[bytes] = []
        values: list[Any] = []
        for reply in replies:
            if isinstance(reply, Mapping):
                names += reply.keys()
                values += reply.values()
            else:  # a flat [field, value, ...] list
                names += reply[0::2]
                values += reply[1::2]
        counts = _counts(values, start)  # first: a bad value changes nothing
        positions = list(map(index.get, names))  # C speed: most ids are known
        for at, found in enumerate(positions):
            if found is None:
                name = names[at] if isinstance(names[at], bytes) else str(names[at]).encode()
                found = index.get(name)
                if found is None:
                    found = index[name] = len(ids)
                    ids.append(name)
                positions[at] = found
        if len(ids) > len(self._totals):
            grown = np.zeros(max(len(ids), 2 * len(self._totals)), dtype=np.int64)
            grown[: len(self._totals)] = self._totals
            self._totals = grown
        clicked = counts > 0  # a count of 0 (written by hand) makes no item hot
        new = (np.asarray(positions, dtype=np.int64)[clicked], counts[clicked])
        old = self._buckets.get(start)
        if old is not None:
            np.subtract.at(self._totals, old[0], old[1])
        np.add.at(self._totals, new[0], new[1])
        self._buckets[start] = new
        self._reads += 1
        self._read[start] = self._reads
        if len(ids) > 2 * self.live() + 1024:
            self._compact()

    def live(self) -> int:
        """Items with clicks in the buckets held."""
        return int(np.count_nonzero(self._totals[: len(self._ids)]))

    def top(self, n: int) -> list[HotItem]:
        """The ``n`` most clicked items of the buckets held (:func:`top_n`)."""
        return top_n(self._ids, self._totals[: len(self._ids)], n)

    def _compact(self) -> None:
        """Forget the ids no held bucket counts any more (items that left the window)."""
        totals = self._totals[: len(self._ids)]
        kept = np.flatnonzero(totals)
        remap = np.full(len(self._ids), -1, dtype=np.int64)
        remap[kept] = np.arange(len(kept))
        self._ids = [self._ids[p] for p in kept.tolist()]
        self._index = {name: p for p, name in enumerate(self._ids)}
        self._totals = totals[kept].copy()
        self._buckets = {s: (remap[pos], c) for s, (pos, c) in self._buckets.items()}


def _counts(values: list[Any], start: int) -> np.ndarray:
    try:
        return np.fromiter(map(int, values), dtype=np.int64, count=len(values))
    except ValueError as exc:
        raise ValueError(
            f"an item counter bucket starting at {start} holds a value that is not an integer "
            f"({exc}); the features workers write only integers: was the key written by hand?"
        ) from None


async def _read_buckets(redis: Any, window: Window, starts: Sequence[int]) -> list[list[Any]]:
    """Per bucket start, its shards' ``HGETALL`` replies: one pipeline per node, one round trip."""
    pipe = NodePipeline(redis)
    for start in starts:
        for key in (keys.item_counter_bucket(s, window.resolution_s, start) for s in _SHARDS):
            pipe.add(key, "HGETALL", key)
    with redis_call("the hot-item read", "the hot-item pool keeps its last snapshot"):
        replies = await pipe.execute()
    width = len(_SHARDS)
    return [replies[i * width : (i + 1) * width] for i in range(len(starts))]


async def read_hot_items(redis: Any, window: Window, *, as_of_ms: int, n: int) -> list[HotItem]:
    """The ``n`` most clicked items of ``window`` as of ``as_of_ms`` (closed buckets only),
    best first, ties by id; one round trip."""
    totals = WindowTotals()
    starts = list(closed_buckets(as_of_ms, window))
    for start, replies in zip(starts, await _read_buckets(redis, window, starts), strict=True):
        totals.put(start, replies)
    return totals.top(n)


class HotItemsReader:
    """The most clicked items of the ``1h`` or ``24h`` item window, read incrementally (see the
    module doc). One per process: it holds each window's bucket counts (the ids and two int64
    values per item and bucket)."""

    def __init__(self, *, redis: Any, features: FeatureSettings, resync: int = 2) -> None:
        self._redis = redis
        fine, coarse = windows_from_settings(features)
        self._windows = {w.name: w for w in (fine, coarse)}
        self._totals = {name: WindowTotals() for name in self._windows}
        self._resync = resync
        self.buckets_read = 0  # buckets read so far (what the reuse saves shows here)

    def window(self, name: str) -> Window:
        found = self._windows.get(name)
        if found is None:
            raise ValueError(f"no item window {name!r}: use one of {sorted(self._windows)}")
        return found

    async def hot_items(self, window: str, *, as_of_ms: int, n: int) -> list[HotItem]:
        """The ``n`` most clicked items of ``window`` as of ``as_of_ms``, best first, ties by
        id; one round trip (the buckets not held, and the ``resync`` read longest ago). Raises
        RedisUnavailable when Redis does not answer (what it held stays)."""
        win = self.window(window)
        totals = self._totals[window]
        starts = list(closed_buckets(as_of_ms, win))
        totals.keep(starts)
        held = set(totals.held())
        missing = [s for s in starts if s not in held]
        wanted = missing + totals.stalest(self._resync, besides=missing)
        replies = await _read_buckets(self._redis, win, wanted)
        for start, shards in zip(wanted, replies, strict=True):
            totals.put(start, shards)
            await asyncio.sleep(0)  # a whole window's first read: one bucket per loop turn
        self.buckets_read += len(wanted)
        return totals.top(n)
