"""The scoring worker's consumer-group rebalance listener (aiokafka's public extension point).

aiokafka calls :meth:`on_partitions_revoked` before a rebalance and
:meth:`on_partitions_assigned` after it, on the consumer's event loop, and waits for both. The
worker hands in what to do at each (publish the assignment, readiness, rebalance metrics).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiokafka import ConsumerRebalanceListener, TopicPartition

logger = logging.getLogger(__name__)

Hook = Callable[[set[TopicPartition]], Awaitable[None]]


class RebalanceListener(ConsumerRebalanceListener):
    """Calls ``on_revoked`` / ``on_assigned`` with the partitions of each rebalance."""

    def __init__(self, *, on_assigned: Hook | None = None, on_revoked: Hook | None = None) -> None:
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        if self._on_revoked is not None:
            await self._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        if self._on_assigned is not None:
            await self._on_assigned(set(assigned))
