"""The hot items' pure parts: the top N of summed bucket counts (ties by id), and the
incremental totals (a bucket replaced, dropped, read again; ids forgotten)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from streams.hot_items import WindowTotals, top_n


def ids(*names: str) -> list[bytes]:
    return [n.encode() for n in names]


def test_top_n_is_best_first_with_ties_by_id_and_no_zero_counts() -> None:
    names = ids("b", "a", "c", "d", "e")
    counts = np.array([3, 3, 7, 0, 1])
    assert top_n(names, counts, 10) == [("c", 7), ("a", 3), ("b", 3), ("e", 1)]
    assert top_n(names, counts, 2) == [("c", 7), ("a", 3)]  # the tie at the cut goes by id
    assert top_n(names, counts, 0) == []
    assert top_n([], np.zeros(0), 5) == []
    # ids compare by code point (UTF-8 bytes keep that order)
    assert top_n(ids("é", "z", "a"), np.array([1, 1, 1]), 3) == [("a", 1), ("z", 1), ("é", 1)]


def test_top_n_equals_a_full_sort() -> None:
    rng = random.Random(5)
    names = ids(*(f"i{k}" for k in range(3000)))
    counts = np.array([rng.randrange(0, 40) for _ in names])
    expected = sorted(((n.decode(), int(c)) for n, c in zip(names, counts, strict=True) if c),
                      key=lambda p: (-p[1], p[0]))  # fmt: skip
    for n in (1, 17, 500, 2999, 5000):
        assert top_n(names, counts, n) == expected[:n]


def test_totals_sum_the_shards_and_buckets_held() -> None:
    totals = WindowTotals()
    totals.put(100, [{b"a": b"2", b"b": b"1"}, {b"c": b"5"}])  # two shards' HGETALL replies
    totals.put(200, [[b"a", b"4", b"d", b"1"], {}])  # a flat reply, an empty (missing) hash
    assert totals.top(10) == [("a", 6), ("c", 5), ("b", 1), ("d", 1)]
    assert totals.held() == [100, 200] and totals.live() == 4
    # a bucket read again replaces what it held (late clicks), it does not add to it
    totals.put(100, [{b"a": b"3", b"b": b"1"}, {b"c": b"5", b"e": b"9"}])
    assert totals.top(10) == [("e", 9), ("a", 7), ("c", 5), ("b", 1), ("d", 1)]
    # a bucket that left the window no longer counts
    totals.keep([200, 300])
    assert totals.held() == [200] and totals.top(10) == [("a", 4), ("d", 1)]
    assert totals.live() == 2


def test_zero_counts_make_no_item_hot_and_bad_values_say_where() -> None:
    totals = WindowTotals()
    totals.put(1, [{b"a": b"0", b"b": b"2"}])
    assert totals.top(5) == [("b", 2)]
    with pytest.raises(ValueError, match="bucket starting at 7 holds a value that is not an int"):
        totals.put(7, [{b"a": b"x"}])
    assert totals.held() == [1]  # what it held stays


def test_stalest_buckets_come_round_in_turn() -> None:
    totals = WindowTotals()
    for start in (10, 20, 30, 40):
        totals.put(start, [{b"a": b"1"}])
    assert totals.stalest(2) == [10, 20]
    assert totals.stalest(2, besides=[10]) == [20, 30]
    totals.put(10, [{b"a": b"1"}])
    totals.put(20, [{b"a": b"1"}])
    assert totals.stalest(2) == [30, 40]
    assert totals.stalest(0) == [] and totals.stalest(9) == [30, 40, 10, 20]


def test_ids_of_items_that_left_the_window_are_forgotten() -> None:
    rng = random.Random(1)
    totals = WindowTotals()
    truth: dict[int, Counter[str]] = {}
    for step in range(60):  # a sliding window of 3 buckets, each with new items
        start = step * 10
        bucket = Counter({f"s{step}-{k}": rng.randrange(1, 9) for k in range(200)})
        bucket.update({"always": 2})
        truth[start] = bucket
        totals.put(start, [{k.encode(): str(v).encode() for k, v in bucket.items()}])
        totals.keep(range(start - 20, start + 1, 10))
        window: Counter[str] = Counter()
        for s in totals.held():
            window.update(truth[s])
        expected = sorted(window.items(), key=lambda p: (-p[1], p[0]))
        assert totals.top(50) == expected[:50]
    assert len(totals._ids) <= 2 * totals.live() + 1024  # forgotten, not kept for ever
    assert totals.live() == 3 * 200 + 1
