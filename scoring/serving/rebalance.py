"""The scoring worker's consumer-group rebalance listener (aiokafka's public extension point).

aiokafka calls :meth:`~RebalanceListener.on_partitions_revoked` before a rebalance (another
worker joined or left, or this one is rejoining) and
:meth:`~RebalanceListener.on_partitions_assigned` after it, on the consumer's event loop, and
waits for both. At each the worker is told (``on_revoked`` / ``on_assigned``: readiness,
rebalance metrics, the group registry's membership). Before partitions move, ``finish`` lets the
batches in flight complete (their replies are produced) and commits every answered offset, so
the partition's next owner starts right after the last answered request instead of answering
the uncommitted ones again (duplicate replies). If this member was already evicted, the commit
fails (``CommitFailedError``): the new owner then answers those requests again, which clients
tolerate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from aiokafka import ConsumerRebalanceListener, TopicPartition

logger = logging.getLogger(__name__)

Hook = Callable[[set[TopicPartition]], Awaitable[None]]


def describe(partitions: Iterable[TopicPartition]) -> str:
    """``rank-requests[0,1,3]``: partitions grouped by topic, for log lines."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    if not by_topic:
        return "none"
    return " ".join(f"{t}[{','.join(map(str, sorted(p)))}]" for t, p in sorted(by_topic.items()))


class RebalanceListener(ConsumerRebalanceListener):
    """``consumer.subscribe([topic], listener=RebalanceListener(finish=..., on_assigned=...,
    on_revoked=...))``.

    On revoke: ``on_revoked`` with the partitions, then (when this member held any) ``finish``,
    which completes the batches in flight and commits every answered offset (the worker bounds
    how long it waits). On assign: ``on_assigned`` with the new assignment."""

    def __init__(
        self,
        *,
        finish: Callable[[], Awaitable[None]] | None = None,
        on_assigned: Hook | None = None,
        on_revoked: Hook | None = None,
    ) -> None:
        self._finish = finish
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self.revocations = 0  # revokes of a non-empty assignment
        self.assignments = 0
        self.assigned: frozenset[TopicPartition] = frozenset()

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        revoked = set(revoked)
        started = time.monotonic()
        # aiokafka logs (and swallows) what a listener raises; the hooks log their own failures.
        if self._on_revoked is not None:
            await self._on_revoked(set(revoked))
        if not revoked:  # the first join, or a member that held nothing: nothing to commit
            logger.info("partitions revoked: none")
            return
        self.revocations += 1
        if self._finish is not None:
            await self._finish()
        logger.info(
            "partitions revoked: %s (in-flight batches finished and answered offsets committed "
            "in %.0f ms)",
            describe(revoked),
            (time.monotonic() - started) * 1000,
        )

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self.assigned = frozenset(assigned)
        self.assignments += 1
        if self._on_assigned is not None:
            await self._on_assigned(set(self.assigned))
