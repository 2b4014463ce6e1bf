"""The aiokafka workers' rebalance listener: tells the worker (membership, readiness,
metrics) and commits what was answered before partitions move."""

from __future__ import annotations

from aiokafka import TopicPartition

from streamrank.runtime.rebalance import RebalanceListener, describe

P0, P1 = TopicPartition("rank-requests", 0), TopicPartition("rank-requests", 1)


def recording() -> tuple[list[tuple[str, object]], RebalanceListener]:
    calls: list[tuple[str, object]] = []

    async def finish() -> None:
        calls.append(("finish", None))

    async def on_revoked(tps: set[TopicPartition]) -> None:
        calls.append(("revoked", frozenset(tps)))

    async def on_assigned(tps: set[TopicPartition]) -> None:
        calls.append(("assigned", frozenset(tps)))

    listener = RebalanceListener(finish=finish, on_revoked=on_revoked, on_assigned=on_assigned)
    return calls, listener


async def test_a_revoke_tells_the_worker_then_commits_what_was_answered() -> None:
    calls, listener = recording()
    await listener.on_partitions_revoked({P0, P1})
    assert calls == [("revoked", frozenset({P0, P1})), ("finish", None)]
    assert listener.revocations == 1


async def test_the_first_join_tells_the_worker_but_has_nothing_to_commit() -> None:
    calls, listener = recording()
    await listener.on_partitions_revoked(set())
    assert calls == [("revoked", frozenset())]
    assert listener.revocations == 0


async def test_an_assignment_is_recorded_and_handed_to_the_worker() -> None:
    calls, listener = recording()
    await listener.on_partitions_assigned({P1})
    assert calls == [("assigned", frozenset({P1}))]
    assert listener.assigned == frozenset({P1}) and listener.assignments == 1


async def test_hooks_are_optional() -> None:
    listener = RebalanceListener()
    await listener.on_partitions_revoked({P0})
    await listener.on_partitions_assigned({P0})
    assert listener.revocations == 1 and listener.assigned == frozenset({P0})


def test_describe_groups_partitions_by_topic() -> None:
    assert describe({P1, P0, TopicPartition("other", 3)}) == "other[3] rank-requests[0,1]"
    assert describe(set()) == "none"
