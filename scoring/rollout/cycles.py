"""The retrain loop's record: one entry per cycle (export -> train -> gate -> publish -> rollout)
in ``sr:retrain:cycles``, newest first, read by ``streamrank rollout status`` and exported as
gauges by the outcomes workers, so a cycle that refused or failed is seen where the rollout is."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import orjson
import redis.asyncio as aioredis

from streamrank import keys
from streamrank.redis.errors import redis_call

Outcome = Literal["published", "refused", "skipped", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("published", "refused", "skipped", "failed")
CYCLES_KEEP = 100
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetrainCycle:
    """What one cycle did: ``outcome`` and why (``reason``), the versions it compared, the gate's
    figures on the held-out slice and the dataset it trained on (``dataset``: sha256, rows)."""

    started_ms: int
    finished_ms: int
    outcome: Outcome
    reason: str
    active: str | None = None
    candidate: str | None = None
    gate: Mapping[str, Any] = field(default_factory=dict)
    dataset: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {**asdict(self), "gate": dict(self.gate), "dataset": dict(self.dataset)}
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> RetrainCycle:
        d = orjson.loads(raw)
        outcome = d.get("outcome")
        if outcome not in OUTCOMES:
            raise ValueError(f"retrain cycle with unknown outcome {outcome!r}")
        return cls(
            started_ms=int(d["started_ms"]),
            finished_ms=int(d["finished_ms"]),
            outcome=outcome,
            reason=str(d.get("reason", "")),
            active=d.get("active"),
            candidate=d.get("candidate"),
            gate=d.get("gate") or {},
            dataset=d.get("dataset") or {},
        )


async def record_cycle(redis: aioredis.Redis, cycle: RetrainCycle) -> None:
    """Append ``cycle`` (newest first), keeping the last :data:`CYCLES_KEEP`."""
    key = keys.retrain_cycles()
    with redis_call("recording the retrain cycle", "the cycle's effects stand; run status later"):
        async with redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, cycle.to_json())
            pipe.ltrim(key, 0, CYCLES_KEEP - 1)
            await pipe.execute()


async def recent_cycles(redis: aioredis.Redis, n: int = 10) -> list[RetrainCycle]:
    """The latest ``n`` cycles, newest first (an entry that does not parse is skipped, logged)."""
    with redis_call("reading the retrain cycles", "check that Redis is up"):
        raw = await redis.lrange(keys.retrain_cycles(), 0, max(0, n - 1))
    cycles = []
    for entry in raw:
        try:
            cycles.append(RetrainCycle.from_json(entry))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("skipping a retrain cycle entry that does not parse: %s", exc)
    return cycles


def last_by_outcome(cycles: list[RetrainCycle]) -> dict[str, RetrainCycle]:
    """The newest cycle of each outcome (what the metrics export)."""
    out: dict[str, RetrainCycle] = {}
    for cycle in cycles:
        out.setdefault(cycle.outcome, cycle)
    return out
