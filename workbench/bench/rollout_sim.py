"""Rollouts replayed offline through the guard and decision code of the real driver, many
times over (``bench rollout``'s measure of how often the guard fires falsely): no Kafka, the
same statistics, guard and step decision, the same stable per-user split."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np


def say(message: str) -> None:
    print(f"bench rollout: {message}", file=sys.stderr, flush=True)


def simulate_rollouts(
    old_scores: np.ndarray,
    new_scores: np.ndarray,
    positives: Sequence[int],
    *,
    runs: int,
    steps: Sequence[int],
    min_outcomes: int,
    guard: str,
    hold_requests: int,
    tick_requests: int,
    max_rounds: int = 20,
    seed: int = 0,
    sequential: bool = True,
) -> dict[str, Any]:
    """The guard and the step decision replayed offline, many times: no Kafka, the same code.

    Each run sends rounds of every test case (a shuffled order per round; users split between
    the versions by the same stable hash as the canary, under a prefix per run and round); a
    request's click is its held-out positive; the guard looks every ``tick_requests`` requests
    on the statistics of the current step, and a step holds for at least ``hold_requests``.
    ``[U, C]`` scores per version, ``positives[u]`` the clicked position. Returns how the runs
    ended (how often a version as good as the old one is rolled back, for instance)."""
    from scoring.model.canary import assign
    from scoring.rollout.guard import decide, evaluate, parse_guard
    from scoring.rollout.stats import VersionStats, stats_of_requests

    checks = parse_guard(guard)
    per_old = [
        stats_of_requests([(list(r), [p])]) for r, p in zip(old_scores, positives, strict=True)
    ]
    per_new = [
        stats_of_requests([(list(r), [p])]) for r, p in zip(new_scores, positives, strict=True)
    ]
    rng = np.random.default_rng(seed)
    ended = {"promoted": 0, "rolled_back": 0, "undecided": 0}
    requests_used: list[int] = []
    for run_no in range(runs):
        step, since, sent = 0, 0, 0
        window = {"old": VersionStats(), "new": VersionStats()}
        outcome = "undecided"
        for round_no in range(max_rounds):
            order = rng.permutation(len(positives))
            for start in range(0, len(order), tick_requests):
                chunk = order[start : start + tick_requests]
                share = steps[step] / 100
                users = [f"sim{seed}-{run_no}-{round_no}-{u}" for u in chunk]
                for u, version in zip(chunk, assign(users, (("old", 1 - share), ("new", share))),
                                      strict=True):  # fmt: skip
                    window[version].add((per_new if version == "new" else per_old)[u])
                sent += len(chunk)
                results = evaluate(checks, window["new"], window["old"],
                                   min_outcomes=min_outcomes, sequential=sequential)  # fmt: skip
                decision = decide(results, step=step, steps=steps, since_ms=since, now_ms=sent,
                                  hold_ms=hold_requests)  # fmt: skip
                if decision.action in ("rollback", "promote"):
                    outcome = "rolled_back" if decision.action == "rollback" else "promoted"
                    break
                if decision.action == "advance":
                    step, since = step + 1, sent
                    window = {"old": VersionStats(), "new": VersionStats()}
            if outcome != "undecided":
                break
        ended[outcome] += 1
        requests_used.append(sent)
    return {
        "runs": runs,
        **ended,
        "requests_per_run_median": int(np.median(requests_used)) if requests_used else 0,
        "hold_requests": hold_requests,
        "tick_requests": tick_requests,
    }


def simulations(
    args: argparse.Namespace, cases: Sequence[Any], scores: dict[str, np.ndarray],
    good: Any, bad: Any, equal: Any,
) -> dict[str, Any]:  # fmt: skip
    """The same rollouts replayed offline many times: how often the guard fires falsely with
    its time-uniform intervals and with fixed-sample ones looked at every tick."""
    from scoring.rollout.guard import parse_steps

    if args.simulated_runs <= 0:
        return {}
    positives = [c.labels.index(1) for c in cases]
    guard = "auc:" + _auc_margin(args.guard)
    common: dict[str, Any] = {
        "runs": args.simulated_runs, "steps": parse_steps(args.steps),
        "min_outcomes": args.min_outcomes, "guard": guard, "hold_requests": 400,
        "tick_requests": 40,
    }  # fmt: skip
    out: dict[str, Any] = {"guard": guard}
    pairs = {
        "equal": (good.version, equal.version),
        "twin": (good.version, good.version),
        "bad": (good.version, bad.version),
    }
    for name, (old, new) in pairs.items():
        if name == "twin" and equal.version.endswith("-twin"):
            continue  # the equal version is the twin already
        say(f"simulating {args.simulated_runs} rollouts offline: {name}")
        out[name] = {
            "time_uniform": simulate_rollouts(
                scores[old], scores[new], positives, sequential=True, **common
            ),
            "fixed_sample": simulate_rollouts(
                scores[old], scores[new], positives, sequential=False, **common
            ),
        }
    return out


def _auc_margin(guard: str) -> str:
    from scoring.rollout.guard import parse_guard

    for check in parse_guard(guard):
        if check.metric == "auc":
            return f"{check.limit:g}"
    return "0.005"
