"""`streamrank top`'s figures from two scrapes of real metric registries: rates, latency
quantiles like Prometheus', per-stage means, cache hit ratio, degraded shares, lag, models."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from scoring.embeddings.metrics import EmbeddingCacheMetrics
from scoring.serving.metrics import ScoringMetrics
from streams.metrics import FeatureMetrics
from workbench.top import Scrape, figures, parse, quantile, render


def test_quantile_interpolates_within_buckets_like_prometheus() -> None:
    buckets = [(0.01, 0.0), (0.02, 50.0), (0.05, 100.0), (float("inf"), 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.02)
    assert quantile(0.25, buckets) == pytest.approx(0.015)
    assert quantile(0.99, buckets) == pytest.approx(0.02 + 0.03 * 49 / 50)
    assert quantile(0.99, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    assert quantile(0.99, [(0.1, 1.0), (float("inf"), 10.0)]) == 0.1  # open-ended bucket


def test_figures_between_two_scrapes() -> None:
    sreg, freg = CollectorRegistry(), CollectorRegistry()
    scoring, features = ScoringMetrics(sreg), FeatureMetrics(freg)
    cache = EmbeddingCacheMetrics.build(sreg)
    scoring.model_encoding("din-a", "int8")
    scoring.set_split((("din-a", 0.9), ("din-b", 0.1)))
    features.events_applied.inc(1000)

    def snap(at: float) -> list[Scrape]:
        return [
            Scrape("features", "f", at, parse(generate_latest(freg).decode())),
            Scrape("scoring", "s", at, parse(generate_latest(sreg).decode())),
            Scrape("scoring", "down", at, error="connection refused"),
        ]

    before = snap(100.0)
    features.events_applied.inc(500)
    features.set_lag("clicks", 0, 7)
    for _ in range(90):
        scoring.observe_reply(degraded=False, reason=None, error=False, topic="rank-results")
        scoring.latency.observe(0.004)
        scoring.observe_stages({"forward": 2.0, "queue_wait": 1.0})
    for _ in range(10):
        scoring.observe_reply(degraded=True, reason="expired: late", error=False)
        scoring.latency.observe(0.04)
    cache.hits.inc(300)
    cache.misses.inc(100)
    scoring.set_lag("rank-requests", 2, 3)
    f = figures(snap(105.0), before)
    assert f["window_s"] == 5.0 and f["up"] == {"features": 1, "scoring": 1}
    assert f["features"]["clicks_applied_per_s"] == pytest.approx(100.0)
    assert f["scoring"]["requests_per_s"] == pytest.approx(20.0)
    assert 3.0 <= f["scoring"]["p50_ms"] <= 5.0
    assert 25.0 <= f["scoring"]["p99_ms"] <= 40.0
    assert f["scoring"]["stage_mean_ms"]["forward"] == pytest.approx(2.0)
    assert f["scoring"]["stage_mean_ms"]["sequence_fetch"] is None
    assert f["scoring"]["degraded_share"] == {"expired": 0.1}
    assert f["scoring"]["models"]["din-a"] == {"share": 0.9, "encoding": "int8"}
    assert f["scoring"]["breaker"] == "closed"
    assert f["scoring"]["cache_hit_ratio"] == 0.75
    assert f["lag"] == {"features": {"clicks[0]": 7.0}, "scoring": {"rank-requests[2]": 3.0}}
    first = figures(before, [])
    assert first["scoring"]["requests_per_s"] is None and first["window_s"] is None
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(render(f))
    text = console.export_text()
    assert (
        "rank requests" in text and "20.0" in text and "din-a" in text and "expired 10.0%" in text
    )
    assert "unreachable: down (connection refused)" in text
    assert "queue_wait: the request's record timestamp (set by the producing client)" in text
