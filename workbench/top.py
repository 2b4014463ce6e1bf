"""``streamrank top``: a live terminal dashboard of the workers, from their ``/metrics``.

Rates and latency quantiles are computed between two scrapes, the way Prometheus' ``rate`` and
``histogram_quantile`` would over that window: :func:`figures` is a pure function of two sets
of :class:`Scrape` (tested without a worker); :func:`render` turns its result into rich tables.
"""

from __future__ import annotations

import asyncio
import math
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from streamrank.runtime.metrics_http import DEFAULT_PORTS

Labels = tuple[tuple[str, str], ...]
STAGES = ("queue_wait", "sequence_fetch", "embedding_lookup", "forward")
QUEUE_WAIT_NOTE = (
    "queue_wait: the request's record timestamp (set by the producing client) to the worker "
    "taking it: the client's linger and acks, the broker, the fetch, and waiting behind "
    "earlier batches"
)
BREAKER = {0: "closed", 1: "half-open", 2: "open"}


def default_url(kind: str) -> str:
    return f"http://127.0.0.1:{DEFAULT_PORTS[kind]}/metrics"


@dataclass(frozen=True)
class Scrape:
    """One scrape of one worker: ``{sample name: {labels: value}}`` (empty when it failed)."""

    kind: str  # features or scoring
    url: str
    at: float  # time.monotonic()
    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)
    error: str | None = None

    def total(self, name: str, **match: str) -> float:
        """The sum of a sample over the label sets that match ``match``."""
        return sum(
            v
            for labels, v in self.samples.get(name, {}).items()
            if all(dict(labels).get(k) == want for k, want in match.items())
        )

    def by(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for labels, v in self.samples.get(name, {}).items():
            out[dict(labels).get(label, "")] += v
        return dict(out)


def parse(text: str) -> dict[str, dict[Labels, float]]:
    out: dict[str, dict[Labels, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return dict(out)


def scrape(kind: str, url: str, *, timeout_s: float = 2.0) -> Scrape:
    """One worker's /metrics now; an unreachable worker is a Scrape with ``error``."""
    at = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return Scrape(kind, url, at, parse(answer.read().decode()))
    except (OSError, ValueError) as exc:
        return Scrape(kind, url, at, error=str(getattr(exc, "reason", exc)))


async def scrape_all(targets: Sequence[tuple[str, str]]) -> list[Scrape]:
    return list(await asyncio.gather(*(asyncio.to_thread(scrape, k, u) for k, u in targets)))


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """``histogram_quantile`` over cumulative ``(le, count)`` buckets (linear within a
    bucket, as Prometheus does); None without observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return lower_le  # in the open-ended bucket: its lower bound, like Prometheus
            span = count - lower_count
            return lower_le + (le - lower_le) * ((rank - lower_count) / span if span else 1.0)
        lower_le, lower_count = le, count
    return ordered[-1][0]


def _delta(now: Sequence[Scrape], before: Sequence[Scrape], fn: Any) -> float:
    """Sum over workers of fn(now) - fn(before), per worker (a restarted worker counts from 0)."""
    prior = {s.url: s for s in before if s.error is None}
    total = 0.0
    for s in now:
        if s.error is not None:
            continue
        was = prior.get(s.url)
        base = fn(was) if was is not None else 0.0
        value = fn(s)
        total += value - base if value >= base else value
    return total


def _bucket_deltas(
    now: Sequence[Scrape], before: Sequence[Scrape], name: str, **match: str
) -> list[tuple[float, float]]:
    les: set[str] = set()
    for s in now:
        for labels in s.samples.get(name, {}):
            d = dict(labels)
            if all(d.get(k) == v for k, v in match.items()):
                les.add(d["le"])
    return [
        (float(le), _delta(now, before, lambda s, le=le: s.total(name, le=le, **match)))
        for le in les
    ]


@dataclass(frozen=True)
class Window:
    """Two scrape rounds and the seconds between them (``before`` empty: no rates yet)."""

    now: Sequence[Scrape]
    before: Sequence[Scrape]

    @property
    def open(self) -> bool:
        return bool(self.before)

    @property
    def seconds(self) -> float:
        latest = max((s.at for s in self.now), default=0)
        return max(1e-9, latest - max((s.at for s in self.before), default=0))

    def of(self, kind: str) -> list[Scrape]:
        return [s for s in self.now if s.kind == kind]

    def delta(self, kind: str, name: str, **match: str) -> float:
        """The increase of a sample over the window, summed over the ``kind`` workers."""
        return _delta(self.of(kind), self.before, lambda s: s.total(name, **match))

    def rate(self, kind: str, name: str, **match: str) -> float | None:
        if not self.open:
            return None
        return self.delta(kind, name, **match) / self.seconds


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def figures(now: Sequence[Scrape], before: Sequence[Scrape]) -> dict[str, Any]:
    """What the dashboard shows, from two scrape rounds (``before`` may be empty)."""
    w = Window(now, before)
    kinds = ("features", "scoring")
    return {
        "window_s": round(w.seconds, 2) if w.open else None,
        "workers": {
            kind: [{"url": s.url, "up": s.error is None, "error": s.error} for s in w.of(kind)]
            for kind in kinds
        },
        "up": {kind: sum(1 for s in w.of(kind) if s.error is None) for kind in kinds},
        "features": _features(w),
        "scoring": _scoring(w),
        "lag": _lag(now),
    }


def _features(w: Window) -> dict[str, Any]:
    up = [s for s in w.of("features") if s.error is None]
    return {
        "clicks_applied_per_s": w.rate("features", "streamrank_features_events_applied_total"),
        "duplicates_per_s": w.rate("features", "streamrank_features_events_duplicate_total"),
        "dead_letters_per_s": w.rate("features", "streamrank_features_dead_letters_total"),
        "event_time_lag_s": max(
            (s.total("streamrank_features_event_time_lag_seconds") for s in up), default=None
        ),
        "partitions": {s.url: int(s.total("streamrank_features_assigned_partitions")) for s in up},
    }


def _scoring(w: Window) -> dict[str, Any]:
    scoring = w.of("scoring")
    latency = "streamrank_scoring_request_latency_seconds_bucket"
    buckets = _bucket_deltas(scoring, w.before, latency) if w.open else []
    hits = w.delta("scoring", "streamrank_embedding_cache_hits_total")
    misses = w.delta("scoring", "streamrank_embedding_cache_misses_total")
    breakers = [
        int(s.total("streamrank_scoring_breaker_state")) for s in scoring if s.error is None
    ]
    return {
        "requests_per_s": w.rate("scoring", "streamrank_scoring_requests_total"),
        "p50_ms": _ms(quantile(0.5, buckets)),
        "p99_ms": _ms(quantile(0.99, buckets)),
        "stage_mean_ms": _stage_means(w),
        "cache_hit_ratio": round(hits / (hits + misses), 4) if w.open and hits + misses else None,
        "degraded_share": _degraded_shares(w),
        "dead_letters_per_s": w.rate("scoring", "streamrank_scoring_dead_letters_total"),
        "breaker": BREAKER.get(max(breakers), "?") if breakers else None,
        "models": _models(scoring),
        "partitions": {
            s.url: int(s.total("streamrank_scoring_assigned_partitions"))
            for s in scoring
            if s.error is None
        },
    }


def _stage_means(w: Window) -> dict[str, float | None]:
    """Mean milliseconds per scoring stage over the window (None: none observed)."""
    means: dict[str, float | None] = {}
    for stage in STAGES:
        count = w.delta("scoring", "streamrank_scoring_stage_seconds_count", stage=stage)
        spent = w.delta("scoring", "streamrank_scoring_stage_seconds_sum", stage=stage)
        means[stage] = _ms(spent / count) if w.open and count else None
    return means


def _degraded_shares(w: Window) -> dict[str, float]:
    """The share of the window's replies degraded, per reason."""
    name = "streamrank_scoring_requests_total"
    answered = w.delta("scoring", name) if w.open else 0.0
    shares: dict[str, float] = {}
    if not (w.open and answered):
        return shares
    reasons = {r for s in w.of("scoring") for r in s.by(name, "reason")}
    for reason in sorted(reasons - {""}):
        n = w.delta("scoring", name, outcome="degraded", reason=reason)
        if n:
            shares[reason] = round(n / answered, 4)
    return shares


def _models(scoring: Sequence[Scrape]) -> dict[str, dict[str, Any]]:
    """Each served version's traffic share (the largest any worker reports) and encoding."""
    shares: dict[str, float] = defaultdict(float)
    encodings: dict[str, str] = {}
    for s in scoring:
        for labels, v in s.samples.get("streamrank_scoring_model_traffic_share", {}).items():
            shares[dict(labels)["version"]] = max(shares[dict(labels)["version"]], v)
        for labels in s.samples.get("streamrank_scoring_model_info", {}):
            d = dict(labels)
            encodings[d["version"]] = d["encoding"]
    return {v: {"share": shares[v], "encoding": encodings.get(v, "?")} for v in sorted(shares)}


def _lag(now: Sequence[Scrape]) -> dict[str, dict[str, float]]:
    """Each consumer group's lag per ``topic[partition]``, as the workers report it."""
    lag: dict[str, dict[str, float]] = {}
    for kind, name in (
        ("features", "streamrank_features_consumer_lag"),
        ("scoring", "streamrank_scoring_consumer_lag"),
    ):
        rows: dict[str, float] = {}
        for s in now:
            if s.kind == kind:
                for labels, v in s.samples.get(name, {}).items():
                    d = dict(labels)
                    rows[f"{d.get('topic')}[{d.get('partition')}]"] = v
        lag[kind] = dict(sorted(rows.items()))
    return lag


def _fmt(value: Any, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value}{unit}"


def render(f: dict[str, Any], *, title: str = "streamrank top") -> Any:
    """The dashboard as rich renderables."""
    from rich.console import Group
    from rich.table import Table

    up = f["up"]
    window = f"over the last {f['window_s']:.1f} s" if f["window_s"] else "first scrape: rates next"
    head = (
        f"{title}: features workers up {up['features']}/{len(f['workers']['features'])}, "
        f"scoring workers up {up['scoring']}/{len(f['workers']['scoring'])} ({window})"
    )
    down = [w for ws in f["workers"].values() for w in ws if not w["up"]]
    parts: list[Any] = [head]
    parts += [f"  unreachable: {w['url']} ({w['error']})" for w in down]

    fe, sc = f["features"], f["scoring"]
    flow = Table(title="throughput and latency", title_justify="left")
    for name in ("", "per s", "p50", "p99", "notes"):
        flow.add_column(name, justify="left" if name in ("", "notes") else "right")
    flow.add_row(
        "clicks applied",
        _fmt(fe["clicks_applied_per_s"]),
        "",
        "",
        f"duplicates {_fmt(fe['duplicates_per_s'])}/s, dead letters "
        f"{_fmt(fe['dead_letters_per_s'])}/s, event-time lag "
        f"{_fmt(fe['event_time_lag_s'], ' s', 2)}",
    )
    flow.add_row(
        "rank requests",
        _fmt(sc["requests_per_s"]),
        _fmt(sc["p50_ms"], " ms"),
        _fmt(sc["p99_ms"], " ms"),
        f"dead letters {_fmt(sc['dead_letters_per_s'])}/s, breaker {sc['breaker'] or '-'}",
    )
    stages = Table(
        title="scoring: mean time per stage (ms)",
        title_justify="left",
        caption=QUEUE_WAIT_NOTE,
        caption_justify="left",
    )
    for stage in STAGES:
        stages.add_column(stage, justify="right")
    stages.add_column("cache hit", justify="right")
    stages.add_row(
        *(_fmt(sc["stage_mean_ms"][s], "", 2) for s in STAGES),
        _fmt(None if sc["cache_hit_ratio"] is None else 100 * sc["cache_hit_ratio"], "%"),
    )
    quality = Table(title="models and degraded replies", title_justify="left")
    quality.add_column("model version")
    quality.add_column("encoding")
    quality.add_column("traffic share", justify="right")
    for version, info in sc["models"].items():
        quality.add_row(version, info["encoding"], f"{100 * info['share']:.0f}%")
    if not sc["models"]:
        quality.add_row("none loaded", "-", "-")
    degraded = ", ".join(f"{r} {100 * v:.1f}%" for r, v in sc["degraded_share"].items()) or "none"
    lag = Table(title="consumer lag (records behind, per partition)", title_justify="left")
    lag.add_column("group")
    lag.add_column("partitions")
    lag.add_column("total", justify="right")
    for kind, rows in f["lag"].items():
        cells = " ".join(f"{k.rsplit('[', 1)[-1].rstrip(']')}:{int(v)}" for k, v in rows.items())
        lag.add_row(kind, cells or "-", str(int(sum(rows.values()))))
    return Group(*parts, flow, stages, quality, f"degraded replies: {degraded}", lag)
