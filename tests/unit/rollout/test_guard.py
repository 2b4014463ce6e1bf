"""The guard's checks and the step decision, on summaries built from known requests."""

from __future__ import annotations

import random

import pytest

from scoring.rollout.guard import (
    Check,
    decide,
    evaluate,
    format_guard,
    parse_guard,
    parse_steps,
)
from scoring.rollout.state import RolloutState
from scoring.rollout.stats import VersionStats, latency_bin, stats_of_requests
from streamrank.errors import ConfigError


def test_parse_guard_reads_units_and_refuses_nonsense() -> None:
    checks = parse_guard("auc:0.005, p99:50ms,degraded:1%,ctr5:0.01")
    assert checks == (
        Check("auc", 0.005), Check("p99", 50.0), Check("degraded", 0.01), Check("ctr5", 0.01)
    )  # fmt: skip
    assert parse_guard("p99:0.2s") == (Check("p99", 200.0),)
    assert parse_guard(format_guard(checks)) == checks
    for bad in ("", "auc", "speed:1", "auc:x", "auc:-1", "auc:1,auc:2"):
        with pytest.raises(ConfigError):
            parse_guard(bad)


def test_parse_steps() -> None:
    assert parse_steps("5,20,50,100") == (5, 20, 50, 100)
    for bad in ("5,20", "100", "20,5,100", "0,100", "a,100"):
        with pytest.raises(ConfigError):
            parse_steps(bad)


def ranker(n: int, *, quality: float, seed: int, latency_ms: float = 5.0) -> VersionStats:
    """``n`` requests of 20 items, one clicked; the clicked item's score is lifted by
    ``quality`` (0 = random ranking)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        target = rng.randrange(20)
        rows.append(([rng.random() + (quality if i == target else 0) for i in range(20)], [target]))
    stats = stats_of_requests((s, c) for s, c in rows)
    stats.lat = {latency_bin(latency_ms): n}
    return stats


def test_a_clearly_worse_version_fails_and_an_equal_one_passes() -> None:
    checks = parse_guard("auc:0.005,ctr5:0.02,p99:50ms,degraded:1%")
    old = ranker(800, quality=0.6, seed=1)
    bad = ranker(300, quality=0.0, seed=2)
    same = ranker(300, quality=0.6, seed=3)
    results = {r.check.metric: r for r in evaluate(checks, bad, old, min_outcomes=100)}
    assert results["auc"].status == "fail" and "worse" in results["auc"].detail
    assert results["ctr5"].status == "fail"
    assert results["p99"].status == "pass" and results["degraded"].status == "pass"
    assert all(r.status == "pass" for r in evaluate(checks, same, old, min_outcomes=100))
    # too few outcomes: pending, whatever the numbers say
    assert all(r.status == "pending" for r in evaluate(checks, bad, old, min_outcomes=1000))


def test_absolute_checks_fail_on_the_new_version_alone() -> None:
    checks = parse_guard("p99:50ms,degraded:1%")
    old = ranker(400, quality=0.6, seed=1)
    slow = ranker(400, quality=0.6, seed=2, latency_ms=80.0)
    slow.deg = 40  # 40 of 440 replies degraded
    results = {r.check.metric: r for r in evaluate(checks, slow, old, min_outcomes=100)}
    assert results["p99"].status == "fail" and "over 50 ms" in results["p99"].detail
    assert results["degraded"].status == "fail"
    # slower than the old version (whatever the machine's load does to both)
    relative = parse_guard("slower:10ms")
    slower = evaluate(relative, slow, ranker(400, quality=0.6, seed=1), min_outcomes=100)
    assert slower[0].status == "fail" and "over +10 ms" in slower[0].detail
    loaded = ranker(400, quality=0.6, seed=3, latency_ms=80.0)
    assert evaluate(relative, slow, loaded, min_outcomes=100)[0].status == "pass"
    assert parse_guard("slower:0.5s") == (Check("slower", 500.0),)
    # a version that only ever degrades still meets the degraded check (no scored requests)
    broken = VersionStats(deg=200)
    out = {r.check.metric: r for r in evaluate(checks, broken, old, min_outcomes=100)}
    assert out["degraded"].status == "fail" and out["p99"].status == "pending"


def test_decide_holds_advances_promotes_and_rolls_back() -> None:
    checks = parse_guard("auc:0.005")
    old = ranker(400, quality=0.6, seed=1)
    good = evaluate(checks, (ranker(400, quality=0.6, seed=4)), old, min_outcomes=100)
    bad = evaluate(checks, (ranker(400, quality=0.0, seed=5)), old, min_outcomes=100)
    steps = (5, 20, 50, 100)
    kw = {"steps": steps, "since_ms": 0, "hold_ms": 10_000}
    assert decide(good, step=0, now_ms=5_000, **kw).action == "hold"  # type: ignore[arg-type]
    assert decide(good, step=0, now_ms=10_000, **kw).action == "advance"  # type: ignore[arg-type]
    assert decide(good, step=2, now_ms=10_000, **kw).action == "promote"  # type: ignore[arg-type]
    d = decide(bad, step=0, now_ms=1, **kw)  # type: ignore[arg-type]
    assert d.action == "rollback" and d.failed == ("auc",)
    # paused: no advance, but the guard still rolls back
    assert decide(good, step=0, now_ms=10_000, paused=True, **kw).action == "hold"  # type: ignore[arg-type]
    assert decide(bad, step=0, now_ms=1, paused=True, **kw).action == "rollback"  # type: ignore[arg-type]
    pending = evaluate(checks, old, old, min_outcomes=10_000)
    held = decide(pending, step=0, now_ms=99_000, **kw)  # type: ignore[arg-type]
    assert held.action == "hold" and "outcomes" in held.reason


def test_state_round_trip_and_split_grows_from_old_to_new() -> None:
    state = RolloutState(
        new="b", old="a", steps=(5, 20, 100), step=1, since_ms=10, status="running",
        guard="auc:0.005", hold_s=1.5, min_outcomes=50, started_ms=5, updated_ms=10,
    )  # fmt: skip
    raw = {k.encode(): v.encode() for k, v in state.fields().items()} | {b"rev": b"7"}
    back = RolloutState.from_hash(raw)
    assert back == state.evolve(rev=7)
    assert state.split_text() == "a:0.8,b:0.2" and state.share == 0.2
    assert state.evolve(status="promoted").share == 1.0
    assert state.evolve(status="rolled_back").share == 0.0
