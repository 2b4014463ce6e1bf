"""The consumer-group metric family: one definition, each worker kind under its own prefix, the
names the alert rules and dashboards use."""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError
from prometheus_client import CollectorRegistry

from streamrank.runtime.group_metrics import GroupMetrics, Wording, commit_offsets, report_lag

WORDING = Wording(items="Records", after="the last batch", committed="records", topic="t")


def names(registry: CollectorRegistry) -> set[str]:
    return {family.name for family in registry.collect()}


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_the_family_is_named_by_the_prefix_and_dependency_up_only_when_asked() -> None:
    registry = CollectorRegistry()
    GroupMetrics(registry, prefix="x_features", wording=WORDING, dependencies=("redis", "kafka"))
    GroupMetrics(registry, prefix="x_scoring", wording=WORDING)
    assert names(registry) == {
        f"x_{kind}_{name}"
        for kind in ("features", "scoring")
        for name in ("consumer_lag", "commits", "rebalances", "last_rebalance_seconds",
                     "assigned_partitions", "event_loop_lag_seconds", "gc_pause_seconds")
    } | {"x_features_dependency_up"}  # fmt: skip
    assert value(registry, "x_features_dependency_up", dependency="redis") == 1


def test_a_new_assignment_drops_the_lag_of_partitions_that_moved_away() -> None:
    registry = CollectorRegistry()
    metrics = GroupMetrics(registry, prefix="x", wording=WORDING, dependencies=("redis",))
    metrics.set_lag("t", 0, 5)
    metrics.set_lag("t", 1, 7)
    metrics.assigned({("t", 1), ("t", 2)}, rebalance_s=1.5)
    assert value(registry, "x_consumer_lag", topic="t", partition="0") is None
    assert value(registry, "x_consumer_lag", topic="t", partition="1") == 7
    assert value(registry, "x_assigned_partitions") == 2
    assert value(registry, "x_last_rebalance_seconds") == 1.5
    assert value(registry, "x_rebalances_total") == 1
    metrics.committed(True)
    metrics.committed(False)
    metrics.dependency("redis", False)
    assert value(registry, "x_commits_total", result="ok") == 1
    assert value(registry, "x_commits_total", result="failed") == 1
    assert value(registry, "x_dependency_up", dependency="redis") == 0


def test_lag_is_reported_for_partitions_still_assigned_only() -> None:
    p0, p1, p2 = (TopicPartition("t", p) for p in range(3))
    lags: list[tuple[str, int, int]] = []

    def highwater(tp: Any) -> int | None:
        if tp == p2:
            raise AssertionError("revoked meanwhile")  # what aiokafka raises
        return 10

    report_lag(
        {p0: 4, p1: 9, p2: 3},
        assigned={p1, p2},
        highwater=highwater,
        on_lag=lambda topic, partition, lag: lags.append((topic, partition, lag)),
    )
    assert lags == [("t", 1, 0)]


class _Consumer:
    """Commits as a group consumer does, or fails as one does in a rebalance."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.committed: dict[TopicPartition, int] = {}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.fail:
            raise CommitFailedError("rebalancing")
        self.committed.update(offsets)


async def test_commit_offsets_counts_each_result_and_never_raises() -> None:
    registry = CollectorRegistry()
    metrics = GroupMetrics(registry, prefix="x", wording=WORDING)
    offsets = {TopicPartition("t", 0): 7}
    ok = _Consumer(fail=False)
    assert await commit_offsets(ok, offsets, metrics=metrics, if_failed="-")  # type: ignore[arg-type]
    assert ok.committed == offsets
    failing = _Consumer(fail=True)
    assert not await commit_offsets(failing, offsets, metrics=metrics, if_failed="-")  # type: ignore[arg-type]
    assert value(registry, "x_commits_total", result="ok") == 1
    assert value(registry, "x_commits_total", result="failed") == 1
