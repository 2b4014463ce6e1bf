"""The rollout guard and the step decision (pure functions).

A guard is a list of checks, e.g. ``auc:0.005,p99:50ms,degraded:1%``:

- relative checks (``auc``, ``gauc``, ``ctr1``, ``ctr5``, ``ctr10``, ``mrr``; higher is better)
  compare the new version with the old one on the same window: the check **fails** when the
  95 % interval of ``new - old`` lies entirely below ``-margin`` (the new version is worse by
  more than the margin, with confidence), and **passes** otherwise;
- absolute checks on the new version alone: ``p99:BUDGET`` (ms) fails when the lower end of the
  p99's interval exceeds the budget; ``degraded:SHARE`` fails when the lower end of the degraded
  share's interval exceeds it;
- ``slower:MARGIN`` (ms) compares the two p99s: it fails when the lower end of the new version's
  p99 interval is above the upper end of the old one's by more than the margin (both versions
  share the workers, so a loaded machine slows both and does not fail it).

A check is **pending** until both versions have ``min_outcomes`` requests in the window (the
degraded check counts every reply routed to the new version), or while its metric has no
value yet (no click at all, no latency). One failed check rolls the rollout back at once; a
step advances when its hold time has passed and every check passes.

The driver looks at every tick, so the guard's intervals are **time-uniform** (an asymptotic
confidence sequence, :func:`scoring.rollout.stats.sequential_z`, tuned for ``min_outcomes``):
a version as good as the old one is rolled back with probability at most 2.5 % per step,
however many looks; fixed-sample 95 % intervals looked at every tick would roll back an
identical twin far more often (docs/rollout.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from scoring.rollout.stats import (
    NONE,
    Z95,
    Estimate,
    Summary,
    VersionStats,
    compare,
    sequential_z,
    summarize,
)
from streamrank.errors import ConfigError

RELATIVE = ("auc", "gauc", "ctr1", "ctr5", "ctr10", "mrr")
ABSOLUTE = ("p99", "degraded", "slower")
DEFAULT_GUARD = "auc:0.005,p99:100ms,degraded:1%"

Status = Literal["pass", "fail", "pending"]
Action = Literal["hold", "advance", "promote", "rollback"]


@dataclass(frozen=True, slots=True)
class Check:
    metric: str
    limit: float  # margin (relative), ms budget (p99) or share (degraded)

    @property
    def relative(self) -> bool:
        return self.metric in RELATIVE

    def describe(self) -> str:
        if self.metric == "p99":
            return f"p99 <= {self.limit:g} ms"
        if self.metric == "slower":
            return f"p99 not slower than the old one's by more than {self.limit:g} ms"
        if self.metric == "degraded":
            return f"degraded <= {self.limit:.2%}"
        return f"{self.metric} not worse by more than {self.limit:g}"


def parse_guard(text: str) -> tuple[Check, ...]:
    """``"auc:0.005,p99:50ms,degraded:1%"`` -> checks; a clear error for anything else."""
    checks: list[Check] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        metric, sep, raw = part.partition(":")
        metric = metric.strip().lower()
        if not sep or metric not in RELATIVE + ABSOLUTE:
            raise ConfigError(
                f"guard check {part!r} is not METRIC:LIMIT with METRIC one of "
                f"{', '.join(RELATIVE + ABSOLUTE)} (e.g. {DEFAULT_GUARD})"
            )
        raw = raw.strip().lower()
        scale = 1.0
        if raw.endswith("%"):
            raw, scale = raw[:-1], 0.01
        elif raw.endswith("ms"):
            raw = raw[:-2]
        elif raw.endswith("s") and metric in ("p99", "slower"):
            raw, scale = raw[:-1], 1000.0
        try:
            limit = float(raw) * scale
        except ValueError:
            raise ConfigError(f"guard check {part!r}: {raw!r} is not a number") from None
        if limit < 0:
            raise ConfigError(f"guard check {part!r}: the limit must not be negative")
        if any(c.metric == metric for c in checks):
            raise ConfigError(f"guard names {metric} twice")
        checks.append(Check(metric, limit))
    if not checks:
        raise ConfigError(f"the guard names no check (e.g. {DEFAULT_GUARD})")
    return tuple(checks)


def format_guard(checks: Sequence[Check]) -> str:
    """The text :func:`parse_guard` reads back to the same checks."""
    out = []
    for c in checks:
        if c.metric in ("p99", "slower"):
            out.append(f"{c.metric}:{c.limit:g}ms")
        elif c.metric == "degraded":
            out.append(f"degraded:{c.limit * 100:g}%")
        else:
            out.append(f"{c.metric}:{c.limit:g}")
    return ",".join(out)


@dataclass(frozen=True, slots=True)
class CheckResult:
    check: Check
    status: Status
    estimate: Estimate  # new - old (relative) or the new version's value (absolute)
    detail: str


def evaluate(
    checks: Sequence[Check],
    new_stats: VersionStats,
    old_stats: VersionStats,
    *,
    min_outcomes: int,
    sequential: bool = True,
) -> list[CheckResult]:
    """Each check of the guard on the two versions' statistics over the same window, with
    time-uniform intervals (``sequential``) or fixed-sample 95 % ones."""
    out = []
    enough = new_stats.req >= min_outcomes and old_stats.req >= min_outcomes

    def z_for(n: int) -> float:
        return sequential_z(n, tuned_for=min_outcomes) if sequential and n > 0 else Z95

    for check in checks:
        if check.relative:
            z = z_for(min(new_stats.req, old_stats.req))
            new, old = summarize(new_stats, z), summarize(old_stats, z)
        else:
            replies = new_stats.req + (new_stats.deg if check.metric == "degraded" else 0)
            z = z_for(replies)
            new, old = summarize(new_stats, z), summarize(old_stats, z)
        if check.relative:
            diff = compare(check.metric, new, old, z) if enough else NONE
            if not enough:
                out.append(_pending(check, new, old, min_outcomes))
            elif diff.value is None or diff.hi is None:
                out.append(CheckResult(check, "pending", diff, f"no {check.metric} yet"))
            elif diff.hi < -check.limit:
                out.append(
                    CheckResult(
                        check,
                        "fail",
                        diff,
                        f"{check.metric} worse: new - old = {diff.value:+.4f} "
                        f"[{diff.lo:+.4f}, {diff.hi:+.4f}], below -{check.limit:g}",
                    )
                )
            else:
                out.append(
                    CheckResult(
                        check,
                        "pass",
                        diff,
                        f"{check.metric}: new - old = {diff.value:+.4f} "
                        f"[{diff.lo:+.4f}, {diff.hi:+.4f}]",
                    )
                )
            continue
        if check.metric == "slower":
            out.append(_slower(check, new, old, min_outcomes=min_outcomes))
            continue
        value = new.metric(check.metric)
        count = new.requests + new.degraded_replies if check.metric == "degraded" else new.requests
        if count < min_outcomes:
            out.append(_pending(check, new, old, min_outcomes, count=count))
        elif value.value is None or value.lo is None:
            out.append(CheckResult(check, "pending", value, f"no {check.metric} yet"))
        else:
            shown = (
                f"{value.value:.1f} ms [{value.lo:.1f}, {_fmt(value.hi, '.1f')}]"
                if check.metric == "p99"
                else f"{value.value:.2%} [{value.lo:.2%}, {_fmt(value.hi, '.2%')}]"
            )
            if value.lo > check.limit:
                out.append(
                    CheckResult(
                        check, "fail", value, f"{check.metric} {shown}: over {_limit(check)}"
                    )
                )
            else:
                out.append(CheckResult(check, "pass", value, f"{check.metric} {shown}"))
    return out


def _slower(check: Check, new: Summary, old: Summary, *, min_outcomes: int) -> CheckResult:
    a, b = new.p99_ms, old.p99_ms
    if min(new.requests, old.requests) < min_outcomes:
        return _pending(check, new, old, min_outcomes)
    if a.value is None or a.lo is None or b.value is None or b.hi is None:
        return CheckResult(check, "pending", NONE, "no p99 interval yet")
    upper = None if a.hi is None or b.lo is None else a.hi - b.lo
    gap = Estimate(a.value - b.value, a.lo - b.hi, upper, a.n)
    shown = f"p99 {a.value:.1f} ms vs {b.value:.1f} ms (new at least {a.lo:.1f}, old at most {b.hi:.1f})"
    if a.lo - b.hi > check.limit:
        return CheckResult(check, "fail", gap, f"slower: {shown}, over +{check.limit:g} ms")
    return CheckResult(check, "pass", gap, shown)


def _fmt(x: float | None, spec: str) -> str:
    return "?" if x is None else format(x, spec)


def _limit(check: Check) -> str:
    return f"{check.limit:g} ms" if check.metric == "p99" else f"{check.limit:.2%}"


def _pending(
    check: Check, new: Summary, old: Summary, min_outcomes: int, *, count: int | None = None
) -> CheckResult:
    have = min(new.requests, old.requests) if count is None else count
    return CheckResult(check, "pending", NONE, f"{have} of {min_outcomes} outcomes")


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: str
    failed: tuple[str, ...] = ()  # metrics of the failed checks


def decide(
    results: Sequence[CheckResult],
    *,
    step: int,
    steps: Sequence[int],
    since_ms: int,
    now_ms: int,
    hold_ms: int,
    paused: bool = False,
) -> Decision:
    """What to do at one tick: roll back on any failed check (paused or not), advance (or
    promote after the last step below 100 %) once the hold is over and every check passes."""
    failed = [r for r in results if r.status == "fail"]
    if failed:
        return Decision(
            "rollback", "; ".join(r.detail for r in failed), tuple(r.check.metric for r in failed)
        )
    if paused:
        return Decision("hold", "paused")
    held_ms = now_ms - since_ms
    waiting = [r for r in results if r.status != "pass"]
    if held_ms < hold_ms or waiting:
        parts = []
        if held_ms < hold_ms:
            parts.append(f"held {held_ms / 1000:.0f}s of {hold_ms / 1000:.0f}s")
        parts += [f"{r.check.metric}: {r.detail}" for r in waiting]
        return Decision("hold", "; ".join(parts))
    passed = "; ".join(r.detail for r in results)
    if step + 1 >= len(steps) or steps[step + 1] >= 100:
        return Decision("promote", f"every check passed at {steps[step]}%: {passed}")
    return Decision("advance", f"every check passed at {steps[step]}%: {passed}")


def parse_steps(text: str) -> tuple[int, ...]:
    """``"5,20,50,100"`` -> percentages, increasing, ending at 100 (the promotion)."""
    try:
        steps = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ConfigError(
            f"--steps {text!r}: give increasing percentages, e.g. 5,20,50,100"
        ) from None
    if (
        len(steps) < 2
        or steps[-1] != 100
        or any(s <= 0 for s in steps)
        or any(b <= a for a, b in itertools.pairwise(steps))
    ):
        raise ConfigError(
            f"--steps {text!r}: give increasing percentages that end at 100 (the promotion), "
            "e.g. 5,20,50,100"
        )
    return steps
