"""Cache policies against plain reference implementations on small traces (pure, no Redis)."""

from __future__ import annotations

import functools
from collections.abc import Hashable

import numpy as np

from scoring.embeddings.policy import (
    CountMinSketch,
    LruPolicy,
    TinyLfuPolicy,
    belady_hits,
    next_use,
)


def _unit(_: object) -> int:
    return 1


def zipf_batches(n_keys: int, batches: int, batch: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n_keys + 1) ** 1.05
    cdf = np.cumsum(w) / w.sum()
    raw = np.searchsorted(cdf, rng.random(batches * batch)).reshape(batches, batch)
    return [list(dict.fromkeys(b.tolist())) for b in raw]


def run_policy(policy: LruPolicy | TinyLfuPolicy, batches: list[list[int]]) -> list[list[bool]]:
    hits = []
    for b in batches:
        got = policy.get_many(b)
        hits.append([v is not None for v in got])
        miss = [k for k, v in zip(b, got, strict=True) if v is None]
        policy.put_many(miss, [f"v{k}" for k in miss])
    return hits


class RefLru:
    """LRU on a plain list, least recent first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[Hashable] = []

    def run(self, batches: list[list[int]]) -> list[list[bool]]:
        out = []
        for b in batches:
            hits = []
            for k in b:
                hit = k in self.items
                if hit:
                    self.items.remove(k)
                    self.items.append(k)
                hits.append(hit)
            out.append(hits)
            for k, hit in zip(b, hits, strict=True):
                if not hit:
                    self.items.append(k)
                    if len(self.items) > self.capacity:
                        self.items.pop(0)
        return out


class RefTinyLfu:
    """W-TinyLFU with exact counters (4-bit saturating, halved every ``sample`` additions) and lists."""

    def __init__(self, capacity: int, sample: int) -> None:
        self.window_cap = max(1, int(capacity * 0.01))
        self.main_cap = capacity - self.window_cap
        self.protected_cap = int(self.main_cap * 0.8)
        self.sample = sample
        self.additions = 0
        self.counts: dict[Hashable, int] = {}
        self.window: list[Hashable] = []
        self.probation: list[Hashable] = []
        self.protected: list[Hashable] = []

    def _count(self, keys: list[int]) -> None:
        for k in keys:
            self.counts[k] = min(15, self.counts.get(k, 0) + 1)
        self.additions += len(keys)
        if self.additions >= self.sample:
            self.counts = {k: v >> 1 for k, v in self.counts.items()}
            self.additions //= 2

    def _admit(self, c: Hashable) -> None:
        if len(self.probation) + len(self.protected) + 1 > self.main_cap:
            freq = self.counts.get(c, 0)
            while len(self.probation) + len(self.protected) + 1 > self.main_cap:
                seg = self.probation if self.probation else self.protected
                if self.counts.get(seg[0], 0) >= freq:
                    return
                seg.pop(0)
        self.probation.append(c)

    def run(self, batches: list[list[int]]) -> list[list[bool]]:
        out = []
        for b in batches:
            self._count(b)
            hits = []
            for k in b:
                if k in self.protected:
                    self.protected.remove(k)
                    self.protected.append(k)
                    hits.append(True)
                elif k in self.window:
                    self.window.remove(k)
                    self.window.append(k)
                    hits.append(True)
                elif k in self.probation:
                    self.probation.remove(k)
                    self.protected.append(k)
                    while len(self.protected) > self.protected_cap:
                        self.probation.append(self.protected.pop(0))
                    hits.append(True)
                else:
                    hits.append(False)
            out.append(hits)
            for k, hit in zip(b, hits, strict=True):
                if not hit:
                    self.window.append(k)
                    while len(self.window) > self.window_cap:
                        self._admit(self.window.pop(0))
        return out


def test_lru_matches_reference() -> None:
    batches = zipf_batches(300, 200, 12, seed=1)
    got = run_policy(LruPolicy(capacity=40, size_of=_unit), batches)
    assert got == RefLru(40).run(batches)


def test_tinylfu_matches_reference_with_exact_counts() -> None:
    # 300 keys in a 2^16-wide sketch: collisions in all 4 rows are vanishingly unlikely, so the
    # sketch must behave exactly like exact counters (including saturation and halving).
    batches = zipf_batches(300, 400, 12, seed=2)
    policy = TinyLfuPolicy(capacity=200, size_of=_unit, expected_entries=200)
    policy.sketch = CountMinSketch(width=1 << 16, sample=500)
    ref = RefTinyLfu(200, sample=500)
    assert run_policy(policy, batches) == ref.run(batches)
    assert set(policy._window) == set(ref.window)
    assert list(policy._probation) == ref.probation
    assert list(policy._protected) == ref.protected
    assert policy.used == len(policy) <= 200


def test_tinylfu_beats_lru_on_skewed_traffic_and_respects_capacity() -> None:
    batches = zipf_batches(20_000, 600, 50, seed=3)
    lru = LruPolicy(capacity=200, size_of=_unit)
    tiny = TinyLfuPolicy(capacity=200, size_of=_unit, expected_entries=200)
    lru_hits = sum(map(sum, run_policy(lru, batches)))
    tiny_hits = sum(map(sum, run_policy(tiny, batches)))
    total = sum(map(len, batches))
    assert tiny_hits / total > lru_hits / total + 0.03
    assert len(tiny) <= 200 and tiny.used <= 200
    assert tiny.evictions > 0 and lru.evictions > 0


def test_byte_budget_with_sizes() -> None:
    lru = LruPolicy(capacity=100, size_of=len)
    lru.put_many(["a", "b", "c"], [b"x" * 40, b"y" * 40, b"z" * 40])
    assert "a" not in lru and "b" in lru and "c" in lru
    assert lru.used == 80 and lru.evictions == 1
    lru.put_many(["big"], [b"q" * 101])  # larger than the whole cache: not cached
    assert "big" not in lru and lru.used == 80
    tiny = TinyLfuPolicy(capacity=1000, size_of=len, expected_entries=50)
    keys = [f"k{i}" for i in range(100)]
    tiny.put_many(keys, [b"r" * 30] * 100)
    assert tiny.used <= 1000 and tiny.used == 30 * len(tiny)


def test_preload_fills_without_evicting() -> None:
    for policy in (
        LruPolicy(capacity=10, size_of=_unit),
        TinyLfuPolicy(capacity=10, size_of=_unit, expected_entries=10),
    ):
        loaded = policy.preload(list(range(20)), ["v"] * 20)
        assert loaded == len(policy) <= 10
        assert policy.evictions == 0
        assert policy.get_many([0])[0] == "v"


def test_count_min_sketch_counts_saturates_and_ages() -> None:
    sketch = CountMinSketch(width=1024, sample=10_000)
    for _ in range(5):
        sketch.add_many(["hot"])
    sketch.add_many([f"cold{i}" for i in range(200)])
    assert sketch.estimate("hot") >= 5
    assert sketch.estimate("never") <= 2  # only collisions can lift an unseen key
    est = sketch.estimate_many(["hot", "cold1"])
    assert int(est[0]) == sketch.estimate("hot") and int(est[1]) >= 1
    for _ in range(30):
        sketch.add_many(["hot"])
    assert sketch.estimate("hot") == 15  # 4-bit saturation
    aging = CountMinSketch(width=1024, sample=40)
    for _ in range(8):
        aging.add_many(["a", "b", "c", "d"])  # 32 additions
    assert aging.estimate("a") == 8
    aging.add_many(["a", "b", "c", "d", "e", "f", "g", "h"])  # 40 reached: halve
    assert aging.estimate("a") == 4
    assert aging.additions == 20


def test_vectorised_sketch_reads_the_same_cells_as_the_scalar_estimate() -> None:
    """estimate_many (numpy, batch) and estimate (plain ints, one key) index the same cells,
    for keys of negative and positive hashes alike."""
    sketch = CountMinSketch(width=4096, sample=10**9)
    keys = [f"pid\x1f{i}" for i in range(3000)] + [-1, -(2**62), 2**62, 0]
    for k in range(5):
        sketch.add_many(keys[k::5])
    sketch.add_many(keys[:700])
    assert sketch.estimate_many(keys) == [sketch.estimate(k) for k in keys]
    assert max(sketch.estimate_many(keys[:700])) >= 2


def test_next_use() -> None:
    trace = np.array([3, 1, 3, 2, 1, 3], dtype=np.int64)
    assert next_use(trace).tolist() == [2, 4, 5, 6, 6, 6]


def brute_force_optimal(trace: list[int], capacity: int) -> int:
    """Max hits over every admission/eviction choice (exponential; tiny traces only)."""

    @functools.cache
    def best(pos: int, cache: frozenset[int]) -> int:
        if pos == len(trace):
            return 0
        key = trace[pos]
        if key in cache:
            return 1 + best(pos + 1, cache)
        options = [best(pos + 1, cache)]  # bypass
        if len(cache) < capacity:
            options.append(best(pos + 1, cache | {key}))
        else:
            options.extend(best(pos + 1, (cache - {v}) | {key}) for v in cache)
        return max(options)

    return best(0, frozenset())


def test_belady_is_optimal_on_small_traces() -> None:
    rng = np.random.default_rng(5)
    for _ in range(30):
        trace = rng.integers(0, 6, 14)
        for capacity in (1, 2, 3):
            assert belady_hits(trace, capacity) == brute_force_optimal(trace.tolist(), capacity)
    assert belady_hits(np.array([1, 1], dtype=np.int64), 0) == 0


def test_belady_bounds_the_online_policies() -> None:
    batches = zipf_batches(2000, 300, 20, seed=7)
    flat = np.array([k for b in batches for k in b], dtype=np.int64)
    opt = belady_hits(flat, 100)
    lru = sum(map(sum, run_policy(LruPolicy(capacity=100, size_of=_unit), batches)))
    tiny = TinyLfuPolicy(capacity=100, size_of=_unit, expected_entries=100)
    assert opt >= sum(map(sum, run_policy(tiny, batches)))
    assert opt >= lru
