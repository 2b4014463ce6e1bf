"""The retrain loop's offline gate: a candidate version goes to a rollout only when it is not
worse than the active version on the same held-out slice of the served log."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GATE_METRICS: tuple[str, ...] = ("gauc", "auc", "hr@10")


@dataclass(frozen=True, slots=True)
class GateRule:
    """Pass when ``candidate[metric] >= active[metric] - tolerance`` on at least
    ``min_samples`` held-out requests."""

    metric: str = "gauc"
    tolerance: float = 0.0
    min_samples: int = 200

    def __post_init__(self) -> None:
        if self.metric not in GATE_METRICS:
            raise ValueError(f"gate metric {self.metric!r}: use one of {', '.join(GATE_METRICS)}")
        if self.tolerance < 0:
            raise ValueError(f"gate tolerance must be >= 0, got {self.tolerance}")


@dataclass(frozen=True, slots=True)
class GateDecision:
    passed: bool
    reason: str
    candidate: Mapping[str, Any]
    active: Mapping[str, Any]
    metric: str

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reason": self.reason,
            "metric": self.metric,
            "candidate": dict(self.candidate),
            "active": dict(self.active),
        }


def decide(
    candidate: Mapping[str, Any], active: Mapping[str, Any] | None, rule: GateRule
) -> GateDecision:
    """The gate's verdict from both versions' figures on the held-out slice (``active`` None:
    nothing serves yet, so the candidate passes on its own sample count)."""
    m = rule.metric
    n = int(candidate.get("n", 0))
    mine = candidate.get(m)
    if n < rule.min_samples:
        return GateDecision(False, f"only {n} held-out requests (< {rule.min_samples}): "
                            "export a longer window or lower the minimum", candidate,
                            active or {}, m)  # fmt: skip
    if mine is None:
        return GateDecision(False, f"the candidate has no {m} on the held-out slice (no "
                            "request with both a click and a non-click)", candidate,
                            active or {}, m)  # fmt: skip
    if active is None:
        return GateDecision(True, "no active version to compare with", candidate, {}, m)
    theirs = active.get(m)
    if theirs is None:
        return GateDecision(True, f"the active version has no {m} here", candidate, active, m)
    diff = float(mine) - float(theirs)
    if diff >= -rule.tolerance:
        return GateDecision(
            True, f"{m} {mine:.4f} vs active {theirs:.4f} ({diff:+.4f})", candidate, active, m
        )
    return GateDecision(
        False,
        f"{m} {mine:.4f} is worse than the active version's {theirs:.4f} by {-diff:.4f} "
        f"(tolerance {rule.tolerance})",
        candidate,
        active,
        m,
    )
