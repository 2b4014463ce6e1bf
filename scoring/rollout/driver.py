"""The staged rollout: start one, drive it step by step under its guard, and the people's
controls (pause, resume, abort).

At each tick the driver (holding the lease) reads the state, reads both versions' online
statistics for the current step's window (requests served since the step began: the same
period for both), evaluates the guard and acts: hold, advance to the next step, promote, or
roll back at once. Every action is a compare-and-set transition (:mod:`.state`), so a driver
that restarts, or another one that takes over after the lease expired, continues from Redis.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from scoring.rollout.guard import (
    CheckResult,
    Decision,
    decide,
    evaluate,
    format_guard,
    parse_guard,
    parse_steps,
)
from scoring.rollout.metrics import RolloutMetrics
from scoring.rollout.online import Window, read_stats
from scoring.rollout.state import Applied, RolloutState, RolloutStore, describe_steps, history_entry
from scoring.rollout.stats import Summary, summarize
from streamrank import clock, keys
from streamrank.errors import ConfigError, RedisUnavailable, StreamrankError, UnknownVersion
from streamrank.redis.client import redis_client
from streamrank.redis.errors import redis_call
from streamrank.runtime.metrics_http import metrics_server, resolve_port
from streamrank.settings import Settings

logger = logging.getLogger(__name__)


def new_owner() -> str:
    """A driver id that says where it runs: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class RolloutConflict(StreamrankError):
    """The rollout state changed under us (another driver or a person acted first)."""

    retriable = True


async def start_rollout(
    redis: aioredis.Redis,
    *,
    new: str,
    steps: str,
    hold_s: float,
    min_outcomes: int,
    guard: str,
    by: str,
    now_ms: int | None = None,
) -> RolloutState:
    """Create the rollout of ``new`` over the active version and move the split to its first
    step. Refuses (with what to do) when anything is in the way."""
    checks = parse_guard(guard)
    parsed_steps = parse_steps(steps)
    if hold_s < 0 or min_outcomes < 1:
        raise ConfigError("--hold must be >= 0 and --min-outcomes >= 1")
    store = RolloutStore(redis=redis)
    with redis_call("reading the serving pointers", "check that Redis is up"):
        active, split, published = await redis.mget(
            [keys.active_model(), keys.model_split(), keys.model_config(new)]
        )
    old = _text(active)
    if published is None:
        raise UnknownVersion(f"version {new} is not published; run `streamrank publish` first")
    if old is None:
        raise ConfigError(
            "no version is active: a rollout replaces the active one (`streamrank activate V`)"
        )
    if old == new:
        raise ConfigError(f"{new} is already the active version")
    current = await store.read()
    if current is not None and current.active:
        raise ConfigError(
            f"a rollout of {current.new} is {current.status} at {current.steps[current.step]}%; "
            "abort it first (`streamrank rollout abort`)"
        )
    if split is not None:
        raise ConfigError(
            f"a canary split is set ({_text(split)}); clear it (`streamrank canary clear`) "
            "before starting a rollout, which moves the split itself"
        )
    now = clock.now_ms() if now_ms is None else now_ms
    state = RolloutState(
        new=new,
        old=old,
        steps=parsed_steps,
        step=0,
        since_ms=now,
        status="running",
        guard=format_guard(checks),
        hold_s=float(hold_s),
        min_outcomes=int(min_outcomes),
        started_ms=now,
        updated_ms=now,
        reason=f"started by {by}: {describe_steps(parsed_steps)}",
    )
    entry = history_entry("start", state, at_ms=now, reason=state.reason, by=by, guard=state.guard)
    applied = await store.transition(
        state,
        expected_rev=current.rev if current is not None else -1,
        owner="",
        entry=entry,
        pointers=("split", state.split_text()),
        fresh=True,
    )
    if not applied.ok:
        raise RolloutConflict("the rollout state changed while starting; run it again")
    logger.info(
        "rollout of %s over %s started: %s, hold %ss, %s outcomes per step, guard %s",
        new,
        old,
        describe_steps(parsed_steps),
        hold_s,
        min_outcomes,
        state.guard,
    )
    return state.evolve(rev=applied.rev)


async def control(
    redis: aioredis.Redis, action: str, *, by: str, now_ms: int | None = None
) -> RolloutState:
    """``pause``, ``resume`` or ``abort`` the rollout, as a person (no lease needed; the
    compare-and-set makes it safe against a driver acting at the same moment)."""
    store = RolloutStore(redis=redis)
    for _ in range(5):
        state = await store.read()
        if state is None or not state.active:
            what = (
                "no rollout" if state is None else f"the rollout of {state.new} is {state.status}"
            )
            raise ConfigError(f"{what}: nothing to {action}")
        now = clock.now_ms() if now_ms is None else now_ms
        pointers: tuple = ("none", "")
        if action == "pause":
            if state.status == "paused":
                return state
            new_state = state.evolve(status="paused", reason=f"paused by {by}", updated_ms=now)
        elif action == "resume":
            if state.status == "running":
                return state
            new_state = state.evolve(status="running", reason=f"resumed by {by}", updated_ms=now)
            pointers = ("split", state.split_text())  # restore the step's split
        elif action == "abort":
            new_state = state.evolve(
                status="aborted", reason=f"aborted by {by}; {state.old} serves all", updated_ms=now
            )
            pointers = ("activate", state.old)
        else:
            raise ConfigError(f"unknown rollout action {action!r} (pause, resume, abort)")
        entry = history_entry(action, new_state, at_ms=now, reason=new_state.reason, by=by)
        applied = await store.transition(
            new_state, expected_rev=state.rev, owner="", entry=entry, pointers=pointers
        )
        if applied.ok:
            logger.info("rollout of %s: %s", state.new, new_state.reason)
            return new_state.evolve(rev=applied.rev)
    raise RolloutConflict(f"the rollout kept changing while trying to {action}; run it again")


@dataclass
class Tick:
    """What one tick saw and did (for logs, the bench and tests)."""

    state: RolloutState | None
    decision: Decision | None = None
    results: list[CheckResult] = field(default_factory=list)
    summaries: dict[str, Summary] = field(default_factory=dict)
    acted: bool = False
    lease: bool = True


def _next_state(
    state: RolloutState, decision: Decision, now: int
) -> tuple[RolloutState, tuple[str, str]]:
    """The state a rollback, promotion or advance leads to, and the serving pointers it sets."""
    if decision.action == "rollback":
        after = state.evolve(
            status="rolled_back",
            reason=f"rolled back at {state.steps[state.step]}%: {decision.reason}",
            updated_ms=now,
        )
        return after, ("activate", state.old)
    if decision.action == "promote":
        after = state.evolve(
            status="promoted", reason=f"promoted: {decision.reason}", updated_ms=now
        )
        return after, ("activate", state.new)
    after = state.evolve(step=state.step + 1, since_ms=now, reason=decision.reason, updated_ms=now)
    return after, ("split", after.split_text())


class RolloutDriver:
    """Drives the rollout in Redis until it ends; one per deployment acts (the lease)."""

    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        bucket_s: int,
        owner: str | None = None,
        tick_s: float = 5.0,
        lease_s: float = 30.0,
        metrics: RolloutMetrics | None = None,
        clock_ms: Callable[[], int] = clock.now_ms,
    ) -> None:
        self._redis = redis
        self._store = RolloutStore(redis=redis)
        self._bucket_s = bucket_s
        self.owner = owner or new_owner()
        self._tick_s = tick_s
        self._lease_ms = int(lease_s * 1000)
        self.metrics = metrics if metrics is not None else RolloutMetrics()
        self._clock = clock_ms
        self.last: Tick | None = None
        self._waiting_logged = False

    async def tick(self) -> Tick:
        """One look: renew the lease, evaluate the guard, act if it is time."""
        if not await self._store.lease(self.owner, self._lease_ms):
            return await self._wait_for_lease()
        self._waiting_logged = False
        state = await self._store.read()
        if state is None or not state.active:
            return Tick(state)
        now = self._clock()
        split = _text(await self._redis.get(keys.model_split()))
        if state.status == "running" and split != state.split_text():
            return await self._pause_for_outside_split(state, split, now)
        tick = await self._judge(state, now)
        self.metrics.set_share(state.new, state.old, state.share)
        if tick.decision is not None and tick.decision.action != "hold":
            await self._act(tick, state, tick.decision, now)
        self.last = tick
        return tick

    async def _wait_for_lease(self) -> Tick:
        """Another driver holds the lease: say so once, and only look."""
        holder, left = await self._store.lease_holder()
        if not self._waiting_logged:
            logger.info(
                "another driver holds the rollout lease (%s, %.0fs left); waiting",
                holder,
                left / 1000,
            )
            self._waiting_logged = True
        return Tick(await self._store.read(), lease=False)

    async def _pause_for_outside_split(
        self, state: RolloutState, split: str | None, now: int
    ) -> Tick:
        """Someone moved the split by hand: pause rather than judge a split we did not set."""
        reason = (
            f"the split was changed outside the rollout (now {split or 'unset'}, expected "
            f"{state.split_text()}); paused: resume to restore the step's split, or abort"
        )
        paused = state.evolve(status="paused", reason=reason, updated_ms=now)
        applied = await self._apply(state, paused, "pause", reason, ("none", ""), now)
        return Tick(paused if applied.ok else await self._store.read(), acted=applied.ok)

    async def _judge(self, state: RolloutState, now: int) -> Tick:
        """Read both versions' statistics for the step's window, evaluate the guard, decide."""
        window = Window(state.since_ms, now, self._bucket_s)
        stats = await read_stats(self._redis, [state.new, state.old], window)
        summaries = {v: summarize(s) for v, s in stats.items()}
        results = evaluate(
            parse_guard(state.guard),
            stats[state.new],
            stats[state.old],
            min_outcomes=state.min_outcomes,
        )
        self._export_guard(results)
        decision = decide(
            results,
            step=state.step,
            steps=state.steps,
            since_ms=state.since_ms,
            now_ms=now,
            hold_ms=int(state.hold_s * 1000),
            paused=state.status == "paused",
        )
        return Tick(state, decision, results, summaries)

    def _export_guard(self, results: list[CheckResult]) -> None:
        for r in results:
            for bound, value in zip(
                ("value", "lo", "hi"), (r.estimate.value, r.estimate.lo, r.estimate.hi), strict=True
            ):
                if value is not None:
                    self.metrics.guard_diff.labels(r.check.metric, bound).set(value)

    async def _act(self, tick: Tick, state: RolloutState, decision: Decision, now: int) -> None:
        """Apply a rollback, promotion or advance; ``tick`` records the state it left."""
        after, pointers = _next_state(state, decision, now)
        applied = await self._apply(state, after, decision.action, after.reason, pointers, now)
        if applied.ok and decision.action == "rollback":
            for metric in decision.failed:
                self.metrics.rollbacks.labels(metric).inc()
        tick.state = after if applied.ok else await self._store.read()
        tick.acted = applied.ok
        if applied.ok:
            self.metrics.set_share(after.new, after.old, after.share)

    async def _apply(
        self,
        before: RolloutState,
        after: RolloutState,
        action: str,
        reason: str,
        pointers: tuple,
        now: int,
    ) -> Applied:
        entry = history_entry(action, after, at_ms=now, reason=reason, by=self.owner)
        applied = await self._store.transition(
            after, expected_rev=before.rev, owner=self.owner, entry=entry, pointers=pointers
        )
        if not applied.ok:
            logger.info(
                "rollout: %s of %s not applied (%s changed first); looking again",
                action,
                before.new,
                "someone" if applied.why == "rev" else "the lease",
            )
            return applied
        self.metrics.decisions.labels(action).inc()
        level = logging.WARNING if action in ("rollback", "pause") else logging.INFO
        logger.log(
            level,
            "rollout of %s over %s: %s (%s -> %s of users on %s)",
            before.new,
            before.old,
            reason if action != "advance" else f"advanced to {after.steps[after.step]}%: {reason}",
            f"{before.share:.0%}",
            f"{after.share:.0%}",
            before.new,
        )
        return applied

    async def run(self, *, stop: asyncio.Event | None = None) -> RolloutState | None:
        """Tick until the rollout ends (or ``stop`` is set); releases the lease at the end."""
        try:
            while stop is None or not stop.is_set():
                try:
                    tick = await self.tick()
                except RedisUnavailable as exc:
                    logger.warning("%s; the rollout driver looks again in %.0fs", exc, self._tick_s)
                    tick = None
                if tick is not None and (tick.state is None or not tick.state.active):
                    return tick.state
                await asyncio.sleep(self._tick_s)
            return await self._store.read()
        finally:
            try:
                await self._store.release(self.owner)
            except RedisUnavailable as exc:
                logger.warning("%s", exc)


async def drive(
    settings: Settings, *, tick_s: float, metrics_port: int | None
) -> RolloutState | None:
    """Drive the current rollout until it ends, serving the rollout metrics on ``metrics_port``
    (else the settings', else the default; 0: none). The lease makes one driver act at a time."""
    registry = CollectorRegistry()
    port = resolve_port(metrics_port, settings.observability.metrics_port, "rollout")
    redis = redis_client(settings.redis)
    try:
        with metrics_server(registry, port):
            driver = RolloutDriver(
                redis=redis,
                bucket_s=settings.outcomes.bucket_s,
                tick_s=tick_s,
                metrics=RolloutMetrics(registry),
            )
            return await driver.run()
    finally:
        await redis.aclose()
