"""`streamrank bench embeddings`, shrunk to a few seconds, on the test Redis."""

from __future__ import annotations

import argparse

import pytest

from tests.conftest import StackInfo
from workbench.bench import embeddings as bench_embeddings


def args(**overrides: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_embeddings.add_arguments(parser)
    ns = parser.parse_args(["--rows", "4000", "--batches", "120", "--latency-batches", "30"])
    for key, value in overrides.items():
        setattr(ns, key, value)
    return ns


# Compact buckets need the hash limits set on every server; uncached lookups run per slot group.
@pytest.mark.cluster
def test_small_run_reports_every_figure(stack: StackInfo) -> None:
    result = bench_embeddings.run(args(), stack.settings())
    assert result["redis"] == "settings' Redis"
    # Ordered by row size, and each above the raw row bytes (36 / 64 / 128): by the table's own
    # keys, since other tests on the same Redis move its used_memory meanwhile.
    kbpr = result["key_bytes_per_row"]
    assert 36 < kbpr["int8"] < kbpr["fp16"] < kbpr["fp32"] and kbpr["fp32"] > 128
    assert set(result["bytes_per_row"]) == {"int8", "fp16", "fp32"}
    assert all(b["compact"] for b in result["buckets"].values())
    for rates in result["hit_rate"].values():
        assert 0 < rates["lru"] <= rates["belady"]
        assert 0 < rates["ours_tinylfu"] <= rates["belady"]
    lookup = result["lookup"]
    for name in ("cached_tinylfu_encoded", "cached_lru_encoded", "uncached_store_script"):
        assert 0 < lookup[name]["p50_us"] <= lookup[name]["p99_us"]
    assert result["lookup_p50_us"] == lookup["cached_tinylfu_encoded"]["p50_us"]
    assert set(result["decode_rows_per_s"]) == {"int8", "fp16", "fp32"}
    assert all(rate > 10_000 for rate in result["decode_rows_per_s"].values())
    assert set(result["goals_met"]) >= {"bytes_per_row_int8<=64", "lookup_p99_us<=1000"}


@pytest.mark.slow
@pytest.mark.standalone_only("starts a private redis-server, whatever the test Redis is")
def test_private_redis_is_started_and_stopped(stack: StackInfo) -> None:
    from workbench.devstack.services import redis_answers

    settings = stack.settings()
    with bench_embeddings.bench_redis(settings, private=True) as (url, started):
        assert started and url != stack.redis_url
        assert redis_answers(url)
    assert not redis_answers(url)


def test_zipf_trace_is_skewed_and_reproducible() -> None:
    t1 = bench_embeddings.zipf_trace(10_000, 200, 150, 1.05, seed=3)
    t2 = bench_embeddings.zipf_trace(10_000, 200, 150, 1.05, seed=3)
    assert t1.shape == (200, 150) and (t1 == t2).all()
    assert t1.min() >= 0 and t1.max() < 10_000
    counts = sorted(((t1 == k).sum() for k in set(t1.ravel().tolist())), reverse=True)
    assert counts[0] > 50 * counts[len(counts) // 2]  # a hot head and a long tail
