"""Stable id hashing and bucketing of the embedding store (pure, no Redis)."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.embeddings.bucketing import (
    bucket_of,
    choose_bucket_count,
    group_by_bucket,
    reference_hash,
    stable_hash,
)


def test_hash_is_pinned() -> None:
    # Published tables are laid out by this hash: changing it orphans every published row.
    assert reference_hash("item-1") == 0x933125D482E1C0B9
    assert reference_hash("42") == 0x16C873383D405014
    assert reference_hash("é-ü") == 0xCEA18164D2A34119


def test_vectorised_hash_matches_reference() -> None:
    rng = np.random.default_rng(3)
    ids = [f"item-{i}" for i in rng.integers(0, 10**9, 500)] + ["42", "é-ü", "x" * 128]
    got = stable_hash(ids)
    assert got.dtype == np.uint64
    assert [int(h) for h in got] == [reference_hash(i) for i in ids]
    assert len(stable_hash([])) == 0


def test_bucket_of_is_in_range_and_deterministic() -> None:
    ids = [str(i) for i in range(10_000)]
    b = bucket_of(ids, 97)
    assert b.min() >= 0 and b.max() < 97
    assert np.array_equal(b, bucket_of(ids, 97))
    assert [int(x) for x in b[:50]] == [reference_hash(i) % 97 for i in ids[:50]]
    # Spread: no bucket holds more than twice its share.
    assert np.bincount(b, minlength=97).max() < 2 * 10_000 / 97
    with pytest.raises(ValueError):
        bucket_of(ids, 0)


def test_choose_bucket_count_keeps_every_bucket_under_the_limit() -> None:
    ids = [f"i{k}" for k in range(50_000)]
    h = stable_hash(ids)
    n = choose_bucket_count(h, max_entries=128, target_fill=0.9)
    counts = np.bincount((h % np.uint64(n)).astype(np.int64), minlength=n)
    assert counts.max() <= 128
    # The loop had to grow past the naive count (0.9 * 128 per bucket overflows somewhere) ...
    assert n > int(np.ceil(50_000 / (0.9 * 128)))
    # ... but no further than needed for about that fill.
    assert n < 50_000 / (0.5 * 128)
    assert choose_bucket_count(h[:0], max_entries=128) == 1
    # No bucket can hold 0 rows: an error, not an endless loop (Redis' entries limit may be 0).
    with pytest.raises(ValueError, match="max_entries must be >= 1"):
        choose_bucket_count(h[:10], max_entries=0)


def test_group_by_bucket_matches_brute_force() -> None:
    buckets = np.array([5, 2, 5, 9, 2, 2, 0], dtype=np.int64)
    order, unique, groups = group_by_bucket(buckets)
    assert unique.tolist() == [0, 2, 5, 9]
    assert [g.tolist() for g in groups] == [[6], [1, 4, 5], [0, 2], [3]]
    assert order.tolist() == [6, 1, 4, 5, 0, 2, 3]
    _, unique0, groups0 = group_by_bucket(np.zeros(0, dtype=np.int64))
    assert len(unique0) == 0 and groups0 == []
