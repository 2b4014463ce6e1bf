"""`streamrank bench cascade`: its arguments, the pure summaries of its phases, its synthetic
catalogue and the in-process stage timings on a real (small, random) retriever."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from streamrank.settings import Settings
from workbench.bench.cascade import resolve_args, stage_timings, verdict
from workbench.bench.cascade_phases import (
    hit_figures,
    load_figures,
    percentiles,
    resolve_rates,
    retrieval_requests,
)
from workbench.bench.cascade_setup import random_artifact, synthetic_catalogue
from workbench.bench.loadgen import RunStats
from workbench.cli.bench import bench_parser


def parse(*argv: str) -> argparse.Namespace:
    args = bench_parser("cascade").parse_args(list(argv))
    resolve_args(args)
    return args


def test_the_default_is_ml100k_and_quick_is_a_small_synthetic_catalogue() -> None:
    args = parse()
    assert args.catalogue == "ml-100k" and args.hot_clicks == 100_000 and args.index is None
    quick = parse("--quick")
    assert quick.catalogue == "synthetic" and quick.items == 20_000 and quick.users == 600
    assert quick.rate_seconds == 2.0 and quick.saturation_requests == 300
    big = parse("--catalogue", "synthetic", "--index", "hnsw")
    assert big.items == 1_000_000 and big.hot_clicks == 920_000 and big.index == "hnsw"


@pytest.mark.parametrize(
    "argv",
    [
        ["--catalogue", "synthetic", "--artifact", "some/dir"],
        ["--artifact", "some/dir", "--index", "ivf"],
        ["--rates", "0.5x,fast"],
        ["--cache-rate", "-1"],
    ],
)
def test_contradictory_or_bad_arguments_stop_before_the_setup(argv: list[str]) -> None:
    with pytest.raises((SystemExit, ValueError)):
        parse(*argv)


def test_rates_are_absolute_or_a_share_of_max_rps() -> None:
    assert resolve_rates("0.25x, 0.5x,40", 180.0) == {"0.25x": 45.0, "0.5x": 90.0, "40": 40.0}
    with pytest.raises(ValueError, match="not positive"):
        resolve_rates("0x", 180.0)


def test_percentiles_of_nothing_are_none() -> None:
    assert percentiles([]) is None
    assert percentiles([1.0] * 99 + [50.0]) == {"p50_ms": 1.0, "p99_ms": 1.49}


def stats_of(replies: dict[str, dict[str, float]], *, cached: set[str]) -> RunStats:
    """A run whose requests were each sent at t=0 and answered at t=10 ms."""
    stats = RunStats()
    for rid, timings in replies.items():
        stats.sent[rid], stats.got[rid] = 0.0, 0.010
        for stage, ms in timings.items():
            stats.stages.setdefault(stage, []).append(ms)
        stats.worker_ms[rid] = timings["total"] - timings["queue_wait"]
    stats.cached_ids |= cached
    stats.cached = len(cached)
    stats.sent["lost"] = 0.0  # never answered
    return stats


def test_hit_figures_count_only_the_cached_replies() -> None:
    stats = stats_of(
        {"a": {"queue_wait": 3.0, "total": 3.5}, "b": {"queue_wait": 2.0, "total": 2.5},
         "c": {"queue_wait": 1.0, "total": 41.0}},  # a miss: the stages ran
        cached={"a", "b"},
    )  # fmt: skip
    hit = hit_figures(stats)
    assert hit["sent"] == 4 and hit["answered"] == 3 and hit["cached_share"] == 0.5
    assert hit["hit_worker_ms"] == {"p50_ms": 0.5, "p99_ms": 0.5}
    assert hit["hit_end_to_end_ms"] == {"p50_ms": 10.0, "p99_ms": 10.0}


def test_load_figures_keep_the_stages_in_cascade_order_and_the_reasons() -> None:
    stats = stats_of({"a": {"queue_wait": 1.0, "rank": 5.0, "retrieval": 2.0, "total": 9.0}},
                     cached=set())  # fmt: skip
    stats.reasons = {"rank_skipped": 1}
    out = load_figures(stats)
    assert list(out["stages"]) == ["retrieval", "rank", "queue_wait", "total"]
    assert out["worker_ms"] == {"p50_ms": 8.0, "p99_ms": 8.0}
    assert out["degraded_by_reason"] == {"rank_skipped": 1} and out["answered"] == 1
    assert out["undegraded_share"] == 1.0  # the count, not the reasons, says how many


def test_verdict_needs_every_request_answered_within_the_budget_at_half_load() -> None:
    result = {
        "miss": {"latency": {"0.5x": {"p99_ms": 80.0, "sent": 10, "answered": 10}}},
        "cache": {"local": {"hit": {"hit_worker_ms": {"p99_ms": 0.7}}},
                  "redis": {"hit": {"hit_worker_ms": None}}},
    }  # fmt: skip
    assert verdict(result) == {
        "p99 end to end <= 100 ms at 0.5x max_rps": True,
        "cache hit p99 < 2 ms (local)": True,
        "cache hit p99 < 2 ms (redis)": False,
    }
    result["miss"]["latency"]["0.5x"]["answered"] = 9
    assert not verdict(result)["p99 end to end <= 100 ms at 0.5x max_rps"]
    assert not verdict({})["p99 end to end <= 100 ms at 0.5x max_rps"]


def test_retrieval_requests_carry_no_items() -> None:
    assert retrieval_requests("p", ["u1", "u2"]) == [("p-0", "u1", []), ("p-1", "u2", [])]


def test_the_synthetic_catalogue_and_its_random_model(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scoring.model.artifact import load_artifact

    cat = synthetic_catalogue(300, users=7, history=5, zipf=1.0, seed=3, tag="t")
    assert cat.item_ids[:2] == ["i0", "i1"] and len(cat.histories) == 7
    assert all(len(h) == 5 and set(h) <= set(cat.item_ids) for h in cat.histories.values())
    assert cat.counts[0] == cat.counts.max() and cat.primary.shape == (300,)
    path, index = random_artifact(cat, index=None, seed=3, workdir=tmp_path, version="bench-t")
    assert index["kind"] == "flat" and index["rows"] == 300 and index["bytes"] > 300 * 32 * 4
    artifact = load_artifact(path)  # the publish path validates it the same way
    retriever = artifact.retriever()
    histories = list(cat.histories.values()) * 3
    out = stage_timings(retriever, histories, Settings(), top_k=10)
    assert set(out) == {"user_vector", "search", "coarse", "rerank", "batch16_user_vectors",
                        "batch16_search"}  # fmt: skip
    assert all(v is not None and 0 <= v["p50_ms"] <= v["p99_ms"] for v in out.values())
    assert np.isfinite(retriever.vectors).all()
