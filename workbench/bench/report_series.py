"""The series that ``streamrank bench report`` draws, taken out of the benchmarks' JSON results
(pure functions: no matplotlib, no I/O but reading a result file). A result without a key a
figure needs gives an error naming the key and the command that makes it."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from streamrank.errors import ConfigError

logger = logging.getLogger(__name__)

MAKES = {
    "scoring": "streamrank bench scoring --json --out scoring.json",
    "embeddings": "streamrank bench embeddings --json --out embeddings.json",
    "streams": "streamrank bench streams --json --out streams.json",
}
# Stages of the scoring worker's reply timings (``timings_ms``), in the order a request meets
# them; ``other`` is the rest of ``total`` (decode, reply encode, produce).
STAGES = ("queue_wait", "sequence_fetch", "embedding_lookup", "forward")


# --- reading -----------------------------------------------------------------------------------


def load_result(path: Path, kind: str) -> dict[str, Any]:
    """A benchmark's JSON result; a clear error when it is missing or not a JSON object."""
    try:
        value = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist: make it with `{MAKES[kind]}`") from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON ({exc}): make it with `{MAKES[kind]}`") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} holds no JSON object: make it with `{MAKES[kind]}`")
    return value


def _need(result: Mapping[str, Any], *path: str, source: str, kind: str) -> Any:
    """``result[a][b]...``; an error naming the key (dotted) and the command that makes it.
    (Keys are separate arguments: a rate or a cache size such as ``0.05`` has a dot in it.)"""
    value: Any = result
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            raise ConfigError(
                f"{source} has no {'.'.join(path)!r}: make it with `{MAKES[kind]}` (current code)"
            )
        value = value[part]
    return value


def _number(value: Any, *, what: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{source}: {what} is {value!r}, not a number")
    return float(value)


# --- series (pure) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LatencyCurve:
    """p50/p99 in ms at each offered rate (req/s), rates ascending."""

    label: str
    rates: tuple[float, ...]
    p50_ms: tuple[float, ...]
    p99_ms: tuple[float, ...]


@dataclass(frozen=True)
class ScoringSeries:
    ours: LatencyCurve
    echo: LatencyCurve | None  # None: the run has no echo baseline
    max_rps: dict[str, float]  # bar label -> req/s, in drawing order
    title: str
    floor: LatencyCurve | None = None  # the true floor (a minimal aiokafka echo), when run


def latency_curve(latency: Mapping[str, Any], *, label: str, source: str, key: str) -> LatencyCurve:
    """The curve of ``{"<rate>": {"p50_ms", "p99_ms", ...}}``; a rate without replies (no
    percentiles) is left out, with a log line."""
    if not isinstance(latency, Mapping) or not latency:
        raise ConfigError(f"{source}: {key!r} holds no offered rates")
    points = []
    for rate_key, summary in latency.items():
        rate = _number(_float_or_none(rate_key), what=f"{key} rate {rate_key!r}", source=source)
        if not isinstance(summary, Mapping) or "p50_ms" not in summary or "p99_ms" not in summary:
            logger.warning(
                "%s: %s at %s req/s has no p50/p99 (no replies?); left out", source, key, rate_key
            )
            continue
        p50 = _number(summary["p50_ms"], what=f"{key}.{rate_key}.p50_ms", source=source)
        p99 = _number(summary["p99_ms"], what=f"{key}.{rate_key}.p99_ms", source=source)
        points.append((rate, p50, p99))
    points.sort()
    return LatencyCurve(
        label=label,
        rates=tuple(p[0] for p in points),
        p50_ms=tuple(p[1] for p in points),
        p99_ms=tuple(p[2] for p in points),
    )


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def scoring_series(result: Mapping[str, Any], *, source: str) -> ScoringSeries:
    """Ours, the echo floor (when the run has it) and the max req/s bars of a scoring result."""
    need = {"source": source, "kind": "scoring"}
    ours = latency_curve(
        _need(result, "latency", **need), label="ours", source=source, key="latency"
    )
    bars = {"ours": _number(_need(result, "max_rps", **need), what="max_rps", source=source)}
    echo = None
    if "echo" in result:
        echo = latency_curve(
            _need(result, "echo", "latency", **need),
            label="echo floor",
            source=source,
            key="echo.latency",
        )
        bars["echo floor"] = _number(
            _need(result, "echo", "max_rps", **need), what="echo.max_rps", source=source
        )
    else:
        logger.warning(
            "%s has no echo baseline ('echo'): drawing ours and naive only (a scoring run of "
            "the code with the echo baseline adds it)",
            source,
        )
    floor = None
    if "floor" in result:
        floor = latency_curve(
            _need(result, "floor", "latency", **need),
            label="true floor",
            source=source,
            key="floor.latency",
        )
        bars["true floor"] = _number(
            _need(result, "floor", "max_rps", **need), what="floor.max_rps", source=source
        )
    if "runtime_ab" in result:
        bars["previous scorer"] = _number(
            _need(result, "runtime_ab", "previous", "max_rps", **need),
            what="runtime_ab.previous.max_rps",
            source=source,
        )
    bars["naive"] = _number(
        _need(result, "naive_max_rps", **need), what="naive_max_rps", source=source
    )
    bars["forward only"] = _number(
        _need(result, "forward_only_rps", **need), what="forward_only_rps", source=source
    )
    config = result.get("config") or {}
    title = "Scoring, end to end through the broker"
    if config:
        title += (
            f" ({_count(config.get('items'))} items, {config.get('candidates', '?')} "
            f"candidates x {config.get('history', '?')} history, "
            f"{config.get('cpus', '?')} CPUs)"
        )
    return ScoringSeries(ours=ours, echo=echo, max_rps=bars, title=title, floor=floor)


@dataclass(frozen=True)
class StageBars:
    """One stacked bar per label: ms of each stage (``other`` = the rest of the total)."""

    labels: tuple[str, ...]
    stages: tuple[str, ...]
    ms: dict[str, tuple[float, ...]]  # stage -> one value per bar
    totals: tuple[float, ...]


def stage_bars(result: Mapping[str, Any], *, source: str) -> StageBars:
    """The worker's mean stage times per request at each offered rate and, per forward mode,
    at saturation (``latency.<rate>.worker_stage_ms_mean``, ``saturation_stage_ms_mean``)."""
    need = {"source": source, "kind": "scoring"}
    groups: list[tuple[str, Mapping[str, Any]]] = []
    latency = _need(result, "latency", **need)
    for rate_key in sorted(latency, key=lambda k: _float_or_none(k) or 0.0):
        stages = _need(result, "latency", rate_key, "worker_stage_ms_mean", **need)
        groups.append((f"{rate_key} req/s", stages))
    for mode, stages in (result.get("saturation_stage_ms_mean") or {}).items():
        if stages:  # None when no reply carried timings
            groups.append((f"saturated\n{mode}", stages))
    named = [s for s in STAGES if any(s in g for _, g in groups)]
    extra = sorted({k for _, g in groups for k in g} - set(STAGES) - {"total"})
    stages_order = (*named, *extra, "other")
    ms: dict[str, list[float]] = {s: [] for s in stages_order}
    totals = []
    for label, group in groups:
        parts = {
            s: _number(group.get(s, 0.0), what=f"{label} {s}", source=source)
            for s in stages_order[:-1]
        }
        summed = sum(parts.values())
        total = _number(group.get("total", summed), what=f"{label} total", source=source)
        parts["other"] = max(0.0, total - summed)
        for s in stages_order:
            ms[s].append(parts[s])
        totals.append(max(total, summed))
    return StageBars(
        labels=tuple(label for label, _ in groups),
        stages=stages_order,
        ms={s: tuple(v) for s, v in ms.items()},
        totals=tuple(totals),
    )


@dataclass(frozen=True)
class HitRateSeries:
    """Hit rate (%) of each policy at each cache size (% of the table), sizes ascending."""

    capacity_pct: tuple[float, ...]
    curves: dict[str, tuple[float, ...]]  # label -> hit rate % per size
    title: str


HIT_RATE_POLICIES = {"ours_tinylfu": "ours (W-TinyLFU)", "lru": "LRU", "belady": "Belady (optimum)"}


def hit_rate_series(result: Mapping[str, Any], *, source: str) -> HitRateSeries:
    """``hit_rate.<fraction>.{ours_tinylfu,lru,belady}`` of an embeddings result, in %."""
    need = {"source": source, "kind": "embeddings"}
    table = _need(result, "hit_rate", **need)
    if not isinstance(table, Mapping) or not table:
        raise ConfigError(f"{source}: 'hit_rate' holds no cache sizes")
    fractions = sorted(
        table, key=lambda k: _number(_float_or_none(k), what=f"cache size {k!r}", source=source)
    )
    curves = {}
    for key, label in HIT_RATE_POLICIES.items():
        values = [_need(result, "hit_rate", f, key, **need) for f in fractions]
        curves[label] = tuple(
            100 * _number(v, what=f"hit_rate.{f}.{key}", source=source)
            for f, v in zip(fractions, values, strict=True)
        )
    title = (
        f"Embedding cache hit rate ({_count(result.get('rows'))} ids, "
        f"Zipf {result.get('zipf', '?')}, batches of {result.get('batch_size', '?')})"
    )
    return HitRateSeries(
        capacity_pct=tuple(100 * float(f) for f in fractions), curves=curves, title=title
    )


@dataclass(frozen=True)
class StreamsSeries:
    """Per run: feature worker events/s, the raw consume ceiling, click -> visible p50/p99."""

    runs: tuple[str, ...]
    events_per_s: tuple[float, ...]
    raw_consume_per_s: tuple[float, ...]
    latency_p50_ms: tuple[float | None, ...]
    latency_p99_ms: tuple[float | None, ...]
    title: str


def streams_series(results: Sequence[tuple[str, Mapping[str, Any]]]) -> StreamsSeries:
    """One entry per ``(source, streams result)``, in the order given."""
    if not results:
        raise ConfigError("no streams results given")
    events, raw, p50, p99, runs = [], [], [], [], []
    for source, result in results:
        runs.append(f"{Path(source).stem}\n{_count(result.get('events'))} clicks")
        need = {"source": source, "kind": "streams"}
        events.append(
            _number(_need(result, "events_per_s", **need), what="events_per_s", source=source)
        )
        raw.append(
            _number(
                _need(result, "raw_consume_per_s", **need), what="raw_consume_per_s", source=source
            )
        )
        p50.append(_optional(result.get("latency_p50_ms")))
        p99.append(_optional(result.get("latency_p99_ms")))
    first = results[0][1]
    title = (
        f"Feature worker against the raw consume ceiling ({first.get('features_path', '?')} "
        f"path, {first.get('cpu_count', '?')} CPUs)"
    )
    return StreamsSeries(
        runs=tuple(runs),
        events_per_s=tuple(events),
        raw_consume_per_s=tuple(raw),
        latency_p50_ms=tuple(p50),
        latency_p99_ms=tuple(p99),
        title=title,
    )


def _count(value: Any) -> str:
    """A count for a title: ``1,000,000``, or ``?`` when the result does not say."""
    return f"{value:,}" if isinstance(value, int) else "?"


def _optional(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
