"""Cache replacement policies bounded by a size budget: plain LRU and W-TinyLFU, plus Belady.

Both policies map hashable keys to values with a size each (bytes in the embedding cache, 1 in
the hit-rate simulation) and never hold more than ``capacity`` size units.

W-TinyLFU (Einziger, Friedman, Manes: "TinyLFU: A Highly Efficient Cache Admission Policy"):
every access bumps a count-min sketch of 4-bit counters (halved every ``10 x`` the cache's
entry count accesses, so the estimate follows recent popularity); new entries go to a small
LRU *window* (1%); an entry pushed out of the window may enter the main segmented LRU only if
the sketch says it is more popular than the main segment's victim. On skewed traffic this keeps
one-hit wonders from flushing the hot set, which is what plain LRU does.

Hot path: the sketch is bumped for a whole batch with numpy; the per-key work is dict moves.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MASK64 = (1 << 64) - 1
_SEEDS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)
_COUNTER_MAX = 15  # 4-bit counters, as in TinyLFU


def _hashes(keys: Sequence[Hashable]) -> npt.NDArray[np.uint64]:
    """Python's hash of each key as uint64 (in-process only: the sketch never leaves the process)."""
    return np.array([hash(k) for k in keys], dtype=np.int64).view(np.uint64)


class CountMinSketch:
    """4-row count-min sketch of saturating 4-bit counters with periodic halving (aging)."""

    def __init__(self, *, width: int, sample: int) -> None:
        bits = max(4, int(np.ceil(np.log2(max(width, 16)))))
        self.width = 1 << bits
        self._shift = 64 - bits
        self._shift_u64 = np.uint64(self._shift)
        self.sample = max(1, sample)
        self.additions = 0
        # bytearrays for fast scalar reads in estimate(), numpy views of them for batch updates
        self._raw = bytearray(len(_SEEDS) * self.width)
        self.table = np.frombuffer(self._raw, dtype=np.uint8).reshape(len(_SEEDS), self.width)
        self._flat = self.table.reshape(-1)  # [4 * width] view
        self._seeds = np.array(_SEEDS, dtype=np.uint64)[:, None]  # [4, 1]
        self._offsets = (np.arange(len(_SEEDS), dtype=np.uint64) * np.uint64(self.width))[:, None]

    def _indexes(self, hashes: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Flat cell index of each key in each row: ``[4, n]`` into ``self._flat``."""
        # uint64 array arithmetic wraps without a warning (only numpy scalars warn), so no
        # errstate block (a large share of this function's time). In place, then viewed as
        # int64 (every index is < 2**63), which numpy indexes with faster than uint64.
        rows = hashes[None, :] * self._seeds  # [4, n]
        rows >>= self._shift_u64
        rows += self._offsets
        return rows.view(np.int64)

    def add_many(self, keys: Sequence[Hashable]) -> None:
        """Count one access of each key (vectorised over the batch)."""
        if not keys:
            return
        idx = self._indexes(_hashes(keys))  # [4, n]
        flat = self._flat
        flat[idx] = np.minimum(flat[idx] + 1, _COUNTER_MAX)
        self.additions += len(keys)
        if self.additions >= self.sample:
            self.table >>= 1
            self.additions //= 2

    def estimate(self, key: Hashable) -> int:
        """Estimated recent access count of one key (never an under-estimate before halving)."""
        h = hash(key) & _MASK64
        t = self._raw
        s = self._shift
        w = self.width
        return min(
            t[((h * _SEEDS[0]) & _MASK64) >> s],
            t[w + (((h * _SEEDS[1]) & _MASK64) >> s)],
            t[2 * w + (((h * _SEEDS[2]) & _MASK64) >> s)],
            t[3 * w + (((h * _SEEDS[3]) & _MASK64) >> s)],
        )

    def estimate_many(self, keys: Sequence[Hashable]) -> list[int]:
        """``estimate`` of each key, vectorised."""
        if not keys:
            return []
        est = self._flat[self._indexes(_hashes(keys))].min(axis=0)  # [n]
        return est.tolist()


class CachePolicy(Protocol):
    """What the embedding cache needs from a replacement policy."""

    capacity: int
    used: int
    evictions: int

    def get_many(self, keys: Sequence[Any]) -> list[Any]: ...

    def put_many(self, keys: Sequence[Any], values: Sequence[Any]) -> None: ...

    def preload(self, keys: Sequence[Any], values: Sequence[Any]) -> int: ...

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...


class LruPolicy(Generic[K, V]):
    """Plain LRU: every miss is admitted; the least recently used entries leave first."""

    def __init__(self, *, capacity: int, size_of: Callable[[V], int]) -> None:
        self.capacity = capacity
        self.size_of = size_of
        self.used = 0
        self.evictions = 0
        self._data: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get_many(self, keys: Sequence[K]) -> list[V | None]:
        data = self._data
        out: list[V | None] = []
        for k in keys:
            v = data.get(k)
            if v is not None:
                data.move_to_end(k)
            out.append(v)
        return out

    def put_many(self, keys: Sequence[K], values: Sequence[V]) -> None:
        data = self._data
        size_of = self.size_of
        for k, v in zip(keys, values, strict=True):
            size = size_of(v)
            if size > self.capacity:
                continue
            old = data.pop(k, None)
            if old is not None:
                self.used -= size_of(old)
            data[k] = v
            self.used += size
            while self.used > self.capacity:
                _, gone = data.popitem(last=False)
                self.used -= size_of(gone)
                self.evictions += 1

    def preload(self, keys: Sequence[K], values: Sequence[V]) -> int:
        """Insert while there is room, never evicting; returns how many went in."""
        loaded = 0
        for k, v in zip(keys, values, strict=True):
            size = self.size_of(v)
            if k in self._data or self.used + size > self.capacity:
                continue
            self._data[k] = v
            self._data.move_to_end(k, last=False)  # warm rows are "older" than live traffic
            self.used += size
            loaded += 1
        return loaded


class TinyLfuPolicy(Generic[K, V]):
    """W-TinyLFU: LRU window (1%) -> sketch admission -> segmented LRU (20% probation, 80% protected)."""

    def __init__(
        self,
        *,
        capacity: int,
        size_of: Callable[[V], int],
        expected_entries: int,
        window_fraction: float = 0.01,
        protected_fraction: float = 0.8,
    ) -> None:
        self.capacity = capacity
        self.size_of = size_of
        self.used = 0
        self.evictions = 0
        self.window_cap = max(1, int(capacity * window_fraction))
        self.main_cap = max(0, capacity - self.window_cap)
        self.protected_cap = int(self.main_cap * protected_fraction)
        entries = max(16, expected_entries)
        self.sketch = CountMinSketch(width=entries, sample=10 * entries)
        self._window: OrderedDict[K, V] = OrderedDict()
        self._probation: OrderedDict[K, V] = OrderedDict()
        self._protected: OrderedDict[K, V] = OrderedDict()
        self._window_used = 0
        self._probation_used = 0
        self._protected_used = 0

    def __len__(self) -> int:
        return len(self._window) + len(self._probation) + len(self._protected)

    def __contains__(self, key: object) -> bool:
        return key in self._window or key in self._probation or key in self._protected

    def get_many(self, keys: Sequence[K]) -> list[V | None]:
        self.sketch.add_many(keys)
        protected_get = self._protected.get
        protected_touch = self._protected.move_to_end
        window_get = self._window.get
        window_touch = self._window.move_to_end
        probation_pop = self._probation.pop
        out: list[V | None] = []
        append = out.append
        for k in keys:
            v = protected_get(k)
            if v is not None:
                protected_touch(k)
            else:
                v = window_get(k)
                if v is not None:
                    window_touch(k)
                else:
                    v = probation_pop(k, None)
                    if v is not None:
                        self._promote(k, v)
            append(v)
        return out

    def _promote(self, key: K, value: V) -> None:
        """A probation hit moves to protected; protected's overflow falls back to probation."""
        size = self.size_of(value)
        self._probation_used -= size
        self._protected[key] = value
        self._protected_used += size
        while self._protected_used > self.protected_cap and self._protected:
            k, v = self._protected.popitem(last=False)
            s = self.size_of(v)
            self._protected_used -= s
            self._probation[k] = v
            self._probation_used += s

    def put_many(self, keys: Sequence[K], values: Sequence[V]) -> None:
        # Hot path (every batch with misses): segment sizes live in locals until the end.
        size_of = self.size_of
        window, probation, protected = self._window, self._probation, self._protected
        window_used = self._window_used
        for k, v in zip(keys, values, strict=True):
            if k in window or k in probation or k in protected:
                continue  # filled by a concurrent lookup meanwhile
            size = size_of(v)
            if size > self.capacity:
                continue
            window[k] = v
            window_used += size
        # Entries pushed out of the window, oldest first: each duels main's victim in turn.
        candidates: list[tuple[K, V, int]] = []
        while window_used > self.window_cap and window:
            ck, cv = window.popitem(last=False)
            cs = size_of(cv)
            window_used -= cs
            candidates.append((ck, cv, cs))
        self._window_used = window_used
        if candidates:
            self._admit_all(candidates)
        self.used = window_used + self._probation_used + self._protected_used

    def _admit_all(self, candidates: list[tuple[K, V, int]]) -> None:
        """Each candidate enters main only if it beats main's victim(s) on frequency.

        The sketch is read in two batches: the candidates, and as many probation victims in
        LRU order (admitted candidates join at the MRU end, so they are never among them).
        """
        size_of = self.size_of
        probation, protected = self._probation, self._protected
        sketch = self.sketch
        victims = list(itertools.islice(probation, len(candidates)))
        both = sketch.estimate_many([c[0] for c in candidates] + victims)  # one vectorised read
        freqs = both[: len(candidates)]
        known = dict(zip(victims, both[len(candidates) :], strict=True))
        main_cap = self.main_cap
        probation_used, protected_used = self._probation_used, self._protected_used
        evictions = 0
        for (ck, cv, cs), freq in zip(candidates, freqs, strict=True):
            if cs > main_cap:
                evictions += 1
                continue
            admitted = True
            while probation_used + protected_used + cs > main_cap:
                segment = probation if probation else protected
                vk = next(iter(segment))
                victim_freq = known.get(vk)
                if victim_freq is None:
                    victim_freq = sketch.estimate(vk)
                evictions += 1
                if victim_freq >= freq:
                    admitted = False  # the candidate loses: dropped
                    break
                vs = size_of(segment.pop(vk))
                if segment is probation:
                    probation_used -= vs
                else:
                    protected_used -= vs
            if admitted:
                probation[ck] = cv
                probation_used += cs
        self._probation_used, self._protected_used = probation_used, protected_used
        self.evictions += evictions

    def _main_used(self) -> int:
        return self._probation_used + self._protected_used

    def preload(self, keys: Sequence[K], values: Sequence[V]) -> int:
        """Insert into the main segment while there is room, never evicting; counts as one access."""
        loaded = 0
        taken: list[K] = []
        for k, v in zip(keys, values, strict=True):
            size = self.size_of(v)
            if k in self or self._main_used() + size > self.main_cap:
                continue
            self._probation[k] = v
            self._probation_used += size
            self.used += size
            taken.append(k)
            loaded += 1
        self.sketch.add_many(taken)
        return loaded


def make_policy(
    name: str, *, capacity: int, size_of: Callable[[Any], int], expected_entries: int
) -> LruPolicy[Any, Any] | TinyLfuPolicy[Any, Any]:
    """``"tinylfu"`` or ``"lru"``."""
    if name == "lru":
        return LruPolicy(capacity=capacity, size_of=size_of)
    if name == "tinylfu":
        return TinyLfuPolicy(capacity=capacity, size_of=size_of, expected_entries=expected_entries)
    raise ValueError(f"unknown cache policy {name!r}; use 'tinylfu' or 'lru'")


def next_use(trace: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """For each position, the next position holding the same key (``len(trace)`` if none)."""
    n = len(trace)
    order = np.argsort(trace, kind="stable")  # positions grouped by key, ascending within a key
    nxt = np.full(n, n, dtype=np.int64)
    same = trace[order[1:]] == trace[order[:-1]]  # [n - 1]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def belady_hits(trace: npt.NDArray[np.int64], capacity: int) -> int:
    """Hits of Belady's optimal (MIN, with bypass) on a key trace with unit sizes.

    On a miss, the entry whose next use is furthest away (the incoming one included) is dropped.
    """
    if capacity <= 0:
        return 0
    nxt = next_use(trace)
    n = len(trace)
    cached: dict[int, int] = {}  # key -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, key), lazily cleaned
    hits = 0
    for pos, key in enumerate(trace.tolist()):
        upcoming = int(nxt[pos])
        if key in cached:
            hits += 1
            cached[key] = upcoming
            heapq.heappush(heap, (-upcoming, key))
            continue
        if upcoming == n:
            continue  # never used again: bypass
        if len(cached) >= capacity:
            while True:
                far, victim = heap[0]
                if cached.get(victim) == -far:
                    break
                heapq.heappop(heap)  # stale entry
            if -far <= upcoming:
                continue  # the incoming key is the furthest: bypass
            heapq.heappop(heap)
            del cached[victim]
        cached[key] = upcoming
        heapq.heappush(heap, (-upcoming, key))
    return hits
