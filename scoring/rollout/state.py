"""The staged rollout's state in Redis, changed only by compare-and-set transitions.

``sr:rollout:state`` (hash) says what is rolling out, at which step since when, and how it
ended; ``rev`` counts transitions. A transition is one script: it applies only if ``rev`` is
still the one the caller read and, for a driver, if the caller still holds the lease; it writes
the state, appends the decision to ``sr:rollout:history`` and moves the serving pointers
(``sr:model:split``, ``sr:model:active``) in the same atomic step, so a person's ``abort`` and
a driver's ``advance`` can never interleave into a split nobody decided.

The lease (``sr:rollout:lease``, ``SET NX PX``) makes one driver act at a time: a second driver
waits or gives up; a driver that died loses it after ``lease_s`` and another takes over from
the state in Redis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson
import redis.asyncio as aioredis

from streamrank import keys
from streamrank.redis.errors import redis_call

Status = Literal["running", "paused", "promoted", "rolled_back", "aborted"]
ACTIVE: frozenset[str] = frozenset({"running", "paused"})
HISTORY_KEEP = 1000

TRANSITION_LUA = """
local state_key, history_key, lease_key, split_key, active_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local expected, owner, action, target = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local rev = tonumber(redis.call('HGET', state_key, 'rev') or '-1')
if rev ~= expected then return {0, 'rev', tostring(rev)} end
if owner ~= '' and redis.call('GET', lease_key) ~= owner then return {0, 'lease', ''} end
local fields = cjson.decode(ARGV[5])
if ARGV[8] == '1' then redis.call('DEL', state_key, history_key) end
for k, v in pairs(fields) do redis.call('HSET', state_key, k, v) end
redis.call('HSET', state_key, 'rev', rev + 1)
redis.call('RPUSH', history_key, ARGV[6])
redis.call('LTRIM', history_key, -tonumber(ARGV[7]), -1)
if action == 'split' then
  redis.call('SET', split_key, target)
elseif action == 'activate' then
  redis.call('SET', active_key, target)
  redis.call('DEL', split_key)
end
return {1, 'ok', tostring(rev + 1)}
"""

LEASE_LUA = """
local holder = redis.call('GET', KEYS[1])
if ARGV[2] == '0' then
  if holder == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
  return 0
end
if not holder then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
if holder == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0
"""


@dataclass(frozen=True, slots=True)
class RolloutState:
    """One rollout: ``new`` replaces ``old`` through ``steps`` (percent of users on ``new``)."""

    new: str
    old: str
    steps: tuple[int, ...]
    step: int
    since_ms: int  # when the current step (or the pause's step) began
    status: Status
    guard: str
    hold_s: float
    min_outcomes: int
    started_ms: int
    updated_ms: int
    reason: str = ""
    rev: int = 0

    @property
    def share(self) -> float:
        """The share of users on ``new`` now (0 after a rollback or abort, 1 once promoted)."""
        if self.status == "promoted":
            return 1.0
        if self.status in ACTIVE:
            return self.steps[self.step] / 100
        return 0.0

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def split_text(self) -> str:
        """The canary split of the current step: old first, so growing it only moves users from
        old to new (the split assigns by cumulative weight over a stable per-user hash)."""
        share = self.steps[self.step] / 100
        return f"{self.old}:{1 - share:.6g},{self.new}:{share:.6g}"

    def fields(self) -> dict[str, str]:
        return {
            "new": self.new,
            "old": self.old,
            "steps": ",".join(str(s) for s in self.steps),
            "step": str(self.step),
            "since_ms": str(self.since_ms),
            "status": self.status,
            "guard": self.guard,
            "hold_s": repr(self.hold_s),
            "min_outcomes": str(self.min_outcomes),
            "started_ms": str(self.started_ms),
            "updated_ms": str(self.updated_ms),
            "reason": self.reason,
        }

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> RolloutState:
        h = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()
        }
        return cls(
            new=h["new"],
            old=h["old"],
            steps=tuple(int(s) for s in h["steps"].split(",")),
            step=int(h["step"]),
            since_ms=int(h["since_ms"]),
            status=h["status"],  # type: ignore[arg-type]  # written by us from Status
            guard=h["guard"],
            hold_s=float(h["hold_s"]),
            min_outcomes=int(h["min_outcomes"]),
            started_ms=int(h["started_ms"]),
            updated_ms=int(h["updated_ms"]),
            reason=h.get("reason", ""),
            rev=int(h.get("rev", "0")),
        )

    def evolve(self, **changes: Any) -> RolloutState:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Applied:
    ok: bool
    why: str  # "ok", "rev" (someone else changed the state first) or "lease" (lost it)
    rev: int


class RolloutStore:
    """Reads and compare-and-set transitions of the rollout state; the driver's lease."""

    def __init__(self, *, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._transition: Any = redis.register_script(TRANSITION_LUA)
        self._lease: Any = redis.register_script(LEASE_LUA)

    async def read(self) -> RolloutState | None:
        with redis_call("reading the rollout state", "check that Redis is up"):
            raw = await self._redis.hgetall(keys.rollout_state())
        return RolloutState.from_hash(raw) if raw else None

    async def history(self, last: int = 20) -> list[dict[str, Any]]:
        with redis_call("reading the rollout history", "check that Redis is up"):
            raw = await self._redis.lrange(keys.rollout_history(), -last, -1)
        return [orjson.loads(r) for r in raw]

    async def transition(
        self,
        state: RolloutState,
        *,
        expected_rev: int,
        owner: str,
        entry: Mapping[str, Any],
        pointers: tuple[Literal["split", "activate", "none"], str] = ("none", ""),
        fresh: bool = False,
    ) -> Applied:
        """Write ``state`` if the stored rev is ``expected_rev`` (-1: none stored) and ``owner``
        holds the lease (``""``: a person, no lease needed); ``pointers`` moves the split or the
        active version in the same step; ``fresh`` replaces a finished rollout and its history."""
        action, target = pointers
        with redis_call("changing the rollout state", "nothing was changed; run it again"):
            ok, why, rev = await self._transition(
                keys=[
                    keys.rollout_state(),
                    keys.rollout_history(),
                    keys.rollout_lease(),
                    keys.model_split(),
                    keys.active_model(),
                ],
                args=[
                    expected_rev,
                    owner,
                    action,
                    target,
                    orjson.dumps(state.fields()),
                    orjson.dumps(dict(entry)),
                    HISTORY_KEEP,
                    "1" if fresh else "0",
                ],
            )
        text = why.decode() if isinstance(why, bytes) else str(why)
        rev_text = rev.decode() if isinstance(rev, bytes) else str(rev)
        return Applied(bool(int(ok)), text, int(rev_text) if rev_text else -1)

    async def lease(self, owner: str, ttl_ms: int) -> bool:
        """Take or renew the lease for ``owner``; False while another driver holds it."""
        with redis_call("taking the rollout lease", "the driver retries"):
            return bool(await self._lease(keys=[keys.rollout_lease()], args=[owner, ttl_ms]))

    async def release(self, owner: str) -> None:
        with redis_call("releasing the rollout lease", "it expires by itself"):
            await self._lease(keys=[keys.rollout_lease()], args=[owner, 0])

    async def lease_holder(self) -> tuple[str | None, int]:
        """``(owner, ms left)`` of the lease, ``(None, 0)`` when free."""
        with redis_call("reading the rollout lease", "check that Redis is up"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.get(keys.rollout_lease())
            pipe.pttl(keys.rollout_lease())
            holder, ttl = await pipe.execute()
        if holder is None:
            return None, 0
        return (holder.decode() if isinstance(holder, bytes) else str(holder)), max(0, int(ttl))


def history_entry(
    action: str, state: RolloutState, *, at_ms: int, reason: str, by: str, **extra: Any
) -> dict[str, Any]:
    """One decision as it is kept in the history (and logged)."""
    return {
        "at_ms": at_ms,
        "action": action,
        "step": state.step,
        "share": state.share,
        "status": state.status,
        "reason": reason,
        "by": by,
        **extra,
    }


def describe_steps(steps: Sequence[int]) -> str:
    return " -> ".join(f"{s}%" for s in steps)
