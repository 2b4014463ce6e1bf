"""What ``streamrank rollout status`` shows: the versions serving now with their online metrics
and intervals over one window, each compared with the baseline, and the rollout's state."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis

from scoring.model.canary import parse_split
from scoring.rollout.cycles import recent_cycles
from scoring.rollout.guard import evaluate, parse_guard
from scoring.rollout.online import Window, read_stats
from scoring.rollout.state import RolloutState, RolloutStore
from scoring.rollout.stats import Estimate, Summary, VersionStats, compare, summarize
from streamrank import keys
from streamrank.redis.errors import redis_call

VERDICT_METRICS = ("auc", "gauc", "ctr5", "mrr")


def verdict(diff: Estimate) -> str:
    """better / worse when the interval of ``new - old`` excludes 0, else not yet significant."""
    if diff.lo is None or diff.hi is None:
        return "no data yet"
    if diff.lo > 0:
        return "better"
    if diff.hi < 0:
        return "worse"
    return "not yet significant"


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


async def rollout_status(
    redis: aioredis.Redis, *, bucket_s: int, window_s: int | None, now_ms: int
) -> dict[str, Any]:
    """The report as a JSON-able dict (the CLI prints it as a table or as JSON).

    The window is the current step's (requests served since it began) while a rollout is
    running, else the trailing ``window_s`` (default 10 minutes)."""
    store = RolloutStore(redis=redis)
    with redis_call("reading the serving pointers", "check that Redis is up"):
        active, split_text = await redis.mget([keys.active_model(), keys.model_split()])
    state = await store.read()
    history = await store.history(10)
    holder, lease_left = await store.lease_holder()
    serving = _serving(active, split_text)
    window, window_name = _window(state, window_s=window_s, bucket_s=bucket_s, now_ms=now_ms)
    versions = list(serving)
    if state is not None:
        versions += [v for v in (state.new, state.old) if v not in versions]
    stats = await read_stats(redis, versions, window) if versions else {}
    summaries = {v: summarize(x) for v, x in stats.items()}
    baseline = _baseline(state, serving)
    report: dict[str, Any] = {
        "now_ms": now_ms,
        "window": {"name": window_name, "start_ms": window.start_ms, "end_ms": window.end_ms},
        "baseline": baseline,
        "versions": [
            _version_row(v, summaries, serving=serving, baseline=baseline, state=state)
            for v in versions
        ],
        "rollout": None,
        "retrain": [asdict(c) for c in await recent_cycles(redis, 5)],
    }
    if state is not None:
        report["rollout"] = {
            **_rollout_fields(state, now_ms),
            "checks": _guard_rows(state, stats) if state.active else [],
            "driver": {"owner": holder, "lease_left_s": round(lease_left / 1000, 1)},
            "history": history,
        }
    return report


def _serving(active: bytes | str | None, split_text: bytes | str | None) -> dict[str, float]:
    """Each version serving now and its share: the canary split's, else the active one's 1.0."""
    if _text(split_text):
        return dict(parse_split(str(_text(split_text))))
    if _text(active):
        return {str(_text(active)): 1.0}
    return {}


def _window(
    state: RolloutState | None, *, window_s: int | None, bucket_s: int, now_ms: int
) -> tuple[Window, str]:
    """The window the report reads, and its name for people."""
    if state is not None and state.active and window_s is None:
        since = datetime.fromtimestamp(state.since_ms / 1000, UTC).strftime("%H:%M:%S UTC")
        name = f"the current step's (since {since}, {(now_ms - state.since_ms) / 1000:.0f}s)"
        return Window(state.since_ms, now_ms, bucket_s), name
    seconds = window_s or 600
    return Window.trailing(seconds, now_ms=now_ms, bucket_s=bucket_s), f"last {seconds}s"


def _baseline(state: RolloutState | None, serving: dict[str, float]) -> str | None:
    """The rollout's old version, else the version serving the largest share."""
    if state is not None and state.active:
        return state.old
    return max(serving, key=lambda v: serving[v]) if serving else None


def _version_row(
    version: str,
    summaries: dict[str, Summary],
    *,
    serving: dict[str, float],
    baseline: str | None,
    state: RolloutState | None,
) -> dict[str, Any]:
    """One version's role, share and metrics; a serving non-baseline one is compared too."""
    s = summaries[version]
    role = (
        "new"
        if state is not None and state.active and version == state.new
        else "baseline"
        if version == baseline
        else "serving"
        if version in serving
        else "not serving"
    )
    row: dict[str, Any] = {"version": version, "role": role, "share": serving.get(version, 0.0)}
    row.update(s.to_json())
    if baseline is not None and version != baseline and version in serving:
        comparisons = {m: compare(m, s, summaries[baseline]) for m in VERDICT_METRICS}
        row["vs_baseline"] = {
            m: {**d.to_json(), "verdict": verdict(d)} for m, d in comparisons.items()
        }
    return row


def _rollout_fields(state: RolloutState, now_ms: int) -> dict[str, Any]:
    return {
        "new": state.new,
        "old": state.old,
        "status": state.status,
        "steps": list(state.steps),
        "step": state.step,
        "share": state.share,
        "since_ms": state.since_ms,
        "held_s": round((now_ms - state.since_ms) / 1000, 1),
        "hold_s": state.hold_s,
        "min_outcomes": state.min_outcomes,
        "guard": state.guard,
        "reason": state.reason,
    }


def _guard_rows(state: RolloutState, stats: dict[str, VersionStats]) -> list[dict[str, Any]]:
    """The active rollout's guard checks as the driver would evaluate them now."""
    checks = parse_guard(state.guard)
    results = evaluate(checks, stats[state.new], stats[state.old], min_outcomes=state.min_outcomes)
    return [
        {
            "check": r.check.describe(),
            "metric": r.check.metric,
            "status": r.status,
            **r.estimate.to_json(),
            "detail": r.detail,
            "kind": "new" if r.check.metric in ("p99", "degraded") else "new - old",
        }
        for r in results
    ]
