"""The consumer-group rebalance listener of the aiokafka workers (aiokafka's public extension
point).

aiokafka calls :meth:`~RebalanceListener.on_partitions_revoked` before a rebalance (another
worker joined or left, or this one is rejoining) and
:meth:`~RebalanceListener.on_partitions_assigned` after it, on the consumer's event loop, and
waits for both. At each the worker's :class:`~streamrank.runtime.membership.Membership` is told
(readiness, rebalance metrics, the group registry), then its own hooks. Before partitions move,
``finish`` lets the batches in flight complete and commits every finished offset, so the
partition's next owner starts right after the last finished record instead of processing the
uncommitted ones again. If this member was already evicted, the commit fails
(``CommitFailedError``): the new owner then processes those records again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from aiokafka import ConsumerRebalanceListener, TopicPartition

from streamrank.runtime.membership import Membership, describe

logger = logging.getLogger(__name__)

Hook = Callable[[set[TopicPartition]], Awaitable[None]]


class RebalanceListener(ConsumerRebalanceListener):
    """``consumer.subscribe([topic], listener=RebalanceListener(membership=..., finish=...))``.

    On revoke: the membership, ``on_revoked`` with the partitions, then (when this member held
    any) ``finish``, which completes the batches in flight and commits every finished offset
    (the worker bounds how long it waits). On assign: the membership, then ``on_assigned`` with
    the new assignment."""

    def __init__(
        self,
        *,
        membership: Membership | None = None,
        finish: Callable[[], Awaitable[None]] | None = None,
        on_assigned: Hook | None = None,
        on_revoked: Hook | None = None,
    ) -> None:
        self._membership = membership
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
        if self._membership is not None:
            self._membership.revoked()
        if self._on_revoked is not None:
            await self._on_revoked(set(revoked))
        if not revoked:  # the first join, or a member that held nothing: nothing to commit
            logger.info("partitions revoked: none")
            return
        self.revocations += 1
        if self._finish is not None:
            await self._finish()
        logger.info(
            "partitions revoked: %s (work in flight finished and committed in %.0f ms)",
            describe(revoked),
            (time.monotonic() - started) * 1000,
        )

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self.assigned = frozenset(assigned)
        self.assignments += 1
        if self._membership is not None:
            self._membership.assigned((tp.topic, tp.partition) for tp in self.assigned)
        if self._on_assigned is not None:
            await self._on_assigned(set(self.assigned))
