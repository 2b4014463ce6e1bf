"""A worker's group bookkeeping follows the rebalance callbacks: readiness, the registry entry
and the rebalance metrics."""

from __future__ import annotations

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from streamrank.runtime.group_metrics import GroupMetrics, Wording
from streamrank.runtime.health import Health
from streamrank.runtime.membership import Membership
from streamrank.runtime.rebalance import RebalanceListener

WORDING = Wording(items="Records", after="the last batch", committed="records", topic="t")


def membership(registry: CollectorRegistry) -> Membership:
    return Membership(
        kind="scoring", group="g", member="m1", topics=["rank-requests"],
        health_=Health(("group", "redis")),
        metrics=GroupMetrics(registry, prefix="x", wording=WORDING),
    )  # fmt: skip


async def test_the_listener_keeps_readiness_registry_and_metrics() -> None:
    registry = CollectorRegistry()
    member = membership(registry)
    finished: list[bool] = []

    async def finish() -> None:
        finished.append(True)

    listener = RebalanceListener(membership=member, finish=finish)
    await listener.on_partitions_revoked(set())  # the first join
    assert member.health.readiness()[1]["checks"]["group"] == {
        "ok": False, "detail": "rebalancing"
    }  # fmt: skip
    await listener.on_partitions_assigned({TopicPartition("rank-requests", 2)})
    assert member.health.readiness()[1]["checks"]["group"] == {
        "ok": True, "detail": "1 partitions of rank-requests"
    }  # fmt: skip
    assert member.registration.partitions == (("rank-requests", 2),)
    assert registry.get_sample_value("x_assigned_partitions") == 1
    assert registry.get_sample_value("x_rebalances_total") == 1
    assert finished == []  # nothing was held at the first join
    await listener.on_partitions_revoked({TopicPartition("rank-requests", 2)})
    assert finished == [True]
    assert member.health.readiness()[1]["checks"]["group"]["ok"] is False
