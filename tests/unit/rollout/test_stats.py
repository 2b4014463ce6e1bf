"""The online statistics against known values and independent brute-force computations."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from scoring.rollout.stats import (
    SCORE_BINS,
    Estimate,
    VersionStats,
    auc_delong,
    compare,
    latency_bin,
    latency_edges,
    mean_estimate,
    newcombe,
    quantile_estimate,
    ranks_by_score,
    request_auc,
    score_bin,
    stats_of_requests,
    summarize,
    weighted_mean_estimate,
    wilson,
)
from scoring.training.evaluation import auc as offline_auc


def test_wilson_matches_the_textbook_values() -> None:
    half = wilson(5, 10)
    assert half.value == 0.5
    assert half.lo == pytest.approx(0.2366, abs=1e-4) and half.hi == pytest.approx(0.7634, abs=1e-4)
    none = wilson(0, 10)
    assert none.lo == 0.0 and none.hi == pytest.approx(3.8415 / 13.8415, abs=1e-4)  # z²/(n+z²)
    assert wilson(0, 0).value is None


def test_newcombe_reproduces_the_papers_worked_example() -> None:
    # Newcombe (1998), method 10: 56/70 vs 48/80 -> difference 0.2000, 95% CI 0.0524 to 0.3339
    diff = newcombe(wilson(56, 70), wilson(48, 80))
    assert diff.value == pytest.approx(0.2)
    assert diff.lo == pytest.approx(0.0524, abs=1e-4) and diff.hi == pytest.approx(0.3339, abs=1e-4)


def _delong_brute_force(pos: list[float], neg: list[float]) -> tuple[float, float]:
    def psi(x: float, y: float) -> float:
        return 1.0 if x > y else 0.5 if x == y else 0.0

    v10 = [sum(psi(x, y) for y in neg) / len(neg) for x in pos]
    v01 = [sum(psi(x, y) for x in pos) / len(pos) for y in neg]
    auc = sum(v10) / len(pos)
    s10 = sum((v - auc) ** 2 for v in v10) / (len(pos) - 1)
    s01 = sum((v - auc) ** 2 for v in v01) / (len(neg) - 1)
    return auc, s10 / len(pos) + s01 / len(neg)


def test_delong_from_histograms_equals_the_placement_formula_with_ties() -> None:
    rng = random.Random(5)
    pos = [rng.randint(20, 60) for _ in range(40)]  # integer "bins": plenty of ties
    neg = [rng.randint(0, 45) for _ in range(90)]
    hist_p: dict[int, int] = {}
    hist_n: dict[int, int] = {}
    for b in pos:
        hist_p[b] = hist_p.get(b, 0) + 1
    for b in neg:
        hist_n[b] = hist_n.get(b, 0) + 1
    got = auc_delong(hist_p, hist_n)
    assert got is not None
    want = _delong_brute_force([float(x) for x in pos], [float(x) for x in neg])
    assert got[0] == pytest.approx(want[0], abs=1e-12) and got[1] == pytest.approx(
        want[1], rel=1e-9
    )
    labels = [1] * len(pos) + [0] * len(neg)
    assert got[0] == pytest.approx(offline_auc(labels, pos + neg), abs=1e-12)
    assert auc_delong({1: 3}, {}) is None


def test_score_bins_are_fine_enough_for_auc() -> None:
    rng = np.random.default_rng(1)
    labels = rng.random(20_000) < 0.05
    scores = 1 / (1 + np.exp(-(rng.normal(size=20_000) + 1.5 * labels)))
    binned = [score_bin(float(s)) for s in scores]
    assert abs(offline_auc(labels, binned) - offline_auc(labels, scores)) < 5e-4
    assert score_bin(0.0) == 0 and score_bin(1.0) == SCORE_BINS - 1
    assert score_bin(float("nan")) == 0 and score_bin(float("inf")) == SCORE_BINS - 1
    assert score_bin(0.2) < score_bin(0.5) < score_bin(0.8)


def test_latency_bins_and_the_p99_interval() -> None:
    assert latency_bin(0.0) == 0 and latency_bin(float("nan")) == 0
    for ms in (0.5, 3.0, 17.2, 250.0):
        lo, hi = latency_edges(latency_bin(ms))
        assert lo <= ms < hi and hi / lo == pytest.approx(1.05)
    rng = np.random.default_rng(2)
    values = rng.lognormal(mean=2.0, sigma=0.5, size=5000)  # ms
    hist: dict[int, int] = {}
    for v in values:
        b = latency_bin(float(v))
        hist[b] = hist.get(b, 0) + 1
    p99 = quantile_estimate(hist, 0.99)
    exact = float(np.quantile(values, 0.99))
    assert p99.value is not None and p99.lo is not None and p99.hi is not None
    assert exact <= p99.value <= exact * 1.05 + 1e-9  # the bin's upper edge: conservative
    assert p99.lo <= exact <= p99.hi and p99.n == 5000
    assert quantile_estimate({}, 0.99).value is None


def test_ranks_and_request_auc() -> None:
    scores = [0.2, 0.9, 0.5, 0.9]
    assert ranks_by_score(scores) == [4, 1, 3, 2]  # ties keep the items' order
    assert request_auc(scores, [2]) == pytest.approx(offline_auc([0, 0, 1, 0], scores))
    assert request_auc(scores, [1, 3]) == pytest.approx(offline_auc([0, 1, 0, 1], scores))
    assert request_auc(scores, []) is None and request_auc(scores, range(4)) is None


def test_mean_and_weighted_mean_intervals_match_numpy() -> None:
    rng = np.random.default_rng(3)
    x = rng.random(200)
    est = mean_estimate(float(x.sum()), float((x * x).sum()), len(x))
    se = x.std(ddof=1) / math.sqrt(len(x))
    assert est.value == pytest.approx(x.mean())
    assert est.hi is not None and (est.hi - est.value) == pytest.approx(1.959964 * se, rel=1e-5)
    w = rng.integers(5, 50, size=200).astype(float)
    a = rng.random(200)
    wm = weighted_mean_estimate(200, w.sum(), (w * a).sum(), (w * w).sum(), (w * w * a).sum(),
                                (w * w * a * a).sum())  # fmt: skip
    mean = (w * a).sum() / w.sum()
    var = 200 / 199 * ((w * (a - mean)) ** 2).sum() / w.sum() ** 2
    assert wm.value == pytest.approx(mean)
    assert wm.hi is not None and (wm.hi - mean) == pytest.approx(
        1.959964 * math.sqrt(var), rel=1e-5
    )
    assert mean_estimate(0.0, 0.0, 0).value is None and mean_estimate(1.0, 1.0, 1).lo is None


def test_summary_of_a_good_and_a_random_ranker() -> None:
    rng = random.Random(9)
    good, bad = [], []
    for _ in range(400):
        target = rng.randrange(20)
        good.append(
            ([rng.random() * 0.5 + (0.5 if i == target else 0) for i in range(20)], {target})
        )
        bad.append(([rng.random() for _ in range(20)], {target}))
    g, b = summarize(stats_of_requests(good)), summarize(stats_of_requests(bad))
    assert g.requests == 400 and g.clicks == 400 and g.impressions == 8000
    assert g.ctr[1].value is not None and g.ctr[1].value > 0.9
    assert g.auc.value is not None and g.auc.value > 0.95
    assert b.auc.lo is not None and b.auc.hi is not None and b.auc.lo < 0.5 < b.auc.hi + 0.05
    assert g.gauc.value == pytest.approx(g.auc.value, abs=0.02)  # one click per request
    assert g.mrr.value is not None and g.mrr.value > 0.9
    diff = compare("auc", b, g)
    assert diff.hi is not None and diff.hi < -0.3  # clearly worse
    ctr = compare("ctr5", b, g)
    assert ctr.hi is not None and ctr.hi < 0
    assert g.degraded.value == 0.0 and g.p99_ms.value is None  # no latencies recorded


def test_stats_hash_round_trip_and_addition() -> None:
    raw = {b"req": b"3", b"deg": b"1", b"rr": b"1.5", b"p:12": b"2", b"n:12": b"0", b"l:40": b"4",
           b"unknown": b"7"}  # fmt: skip
    s = VersionStats.from_hash(raw)
    assert s.req == 3 and s.deg == 1 and s.rr == 1.5 and s.pos == {12: 2} and s.neg == {}
    total = VersionStats.total([s, s])
    assert total.req == 6 and total.pos == {12: 4} and total.lat == {40: 8}
    assert Estimate(0.5, 0.4, 0.6, 10).to_json() == {"value": 0.5, "lo": 0.4, "hi": 0.6, "n": 10}


def test_sequential_z_is_wider_than_one_look_and_grows_slowly() -> None:
    from scoring.rollout.stats import sequential_z

    # alpha 0.05 tuned at n: rho² n = -2 ln α + ln(1 - 2 ln α) = 7.936; z² = 2(8.936/7.936) ln(√8.936/α)
    assert sequential_z(100, tuned_for=100) == pytest.approx(3.035, abs=1e-3)
    assert sequential_z(200, tuned_for=200) == pytest.approx(sequential_z(100, tuned_for=100))
    zs = [sequential_z(n, tuned_for=100) for n in (100, 1_000, 10_000, 100_000)]
    assert zs == sorted(zs) and zs[-1] < 5.0  # √log growth
    assert sequential_z(10, tuned_for=100) > sequential_z(100, tuned_for=100) > 1.96
