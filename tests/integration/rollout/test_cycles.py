"""The retrain loop's record on the real Redis: cycles newest first, capped, shown by the
rollout status and exported as gauges."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from scoring.rollout.cycles import CYCLES_KEEP, RetrainCycle, recent_cycles, record_cycle
from scoring.rollout.metrics import OutcomeMetrics
from scoring.rollout.status import rollout_status
from streamrank import keys

pytestmark = pytest.mark.standalone_only("the rollout keys are not cluster-safe yet")


def cycle(n: int, outcome: Any = "published", **kw: Any) -> RetrainCycle:
    return RetrainCycle(started_ms=n * 1000, finished_ms=n * 1000 + 500, outcome=outcome,
                        reason=f"cycle {n}", **kw)  # fmt: skip


async def test_cycles_are_kept_newest_first_capped_and_shown_by_status(redis: Any) -> None:
    await redis.delete(keys.retrain_cycles())
    for n in range(CYCLES_KEEP + 3):
        await record_cycle(redis, cycle(n))
    got = await recent_cycles(redis, 3)
    assert [c.reason for c in got] == [f"cycle {n}" for n in (102, 101, 100)]
    assert await redis.llen(keys.retrain_cycles()) == CYCLES_KEEP
    report = await rollout_status(redis, bucket_s=10, window_s=60, now_ms=10**12)
    assert [c["reason"] for c in report["retrain"]][:2] == ["cycle 102", "cycle 101"]


async def test_gauges_show_the_latest_cycle_of_each_outcome_and_its_gate(redis: Any) -> None:
    await redis.delete(keys.retrain_cycles())
    gate = {"metric": "gauc", "candidate": {"gauc": 0.61}, "active": {"gauc": 0.66}}
    await record_cycle(redis, cycle(1, "published", candidate="v1"))
    await record_cycle(redis, cycle(2, "refused", candidate="v2", gate=gate))
    await redis.lpush(keys.retrain_cycles(), b"not json")  # an entry it cannot read is skipped
    metrics = OutcomeMetrics(CollectorRegistry())
    metrics.export_cycles(await recent_cycles(redis, 20))
    r = metrics.registry
    name = "streamrank_retrain_last_cycle_timestamp_seconds"
    assert r.get_sample_value(name, {"outcome": "published"}) == 1.5
    assert r.get_sample_value(name, {"outcome": "refused"}) == 2.5
    gate_name = "streamrank_retrain_gate_metric"
    assert r.get_sample_value(gate_name, {"role": "candidate", "metric": "gauc"}) == 0.61
    assert r.get_sample_value(gate_name, {"role": "active", "metric": "gauc"}) == 0.66
