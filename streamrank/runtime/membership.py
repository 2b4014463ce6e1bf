"""A worker's place in its consumer group, kept from its rebalance callbacks (aiokafka's
listener: :mod:`streamrank.runtime.rebalance`; Faust's partition signals): readiness (the
``group`` check), its entry in the group registry (:mod:`streamrank.runtime.groups`) and the
rebalance metrics (:mod:`streamrank.runtime.group_metrics`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from streamrank.runtime import groups, health
from streamrank.runtime.group_metrics import GroupMetrics
from streamrank.runtime.health import Health
from streamrank.runtime.tasks import cancel_and_wait

logger = logging.getLogger(__name__)


def describe(partitions: Iterable[tuple[str, int]]) -> str:
    """``rank-requests[0,1,3]``: (topic, partition) pairs grouped by topic, for log lines."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    if not by_topic:
        return "none"
    return " ".join(f"{t}[{','.join(map(str, sorted(p)))}]" for t, p in sorted(by_topic.items()))


class Membership:
    """``revoked()`` / ``assigned(partitions)`` from the rebalance callbacks (no I/O there);
    :meth:`tasks` on the worker's loop (liveness beats, Redis PING, the registry entry);
    :meth:`leave` when the worker stops."""

    def __init__(
        self,
        *,
        kind: str,
        group: str,
        member: str,
        topics: Sequence[str],
        health_: Health,
        metrics: GroupMetrics,
    ) -> None:
        self.registration = groups.Registration(redis=None, group=group, member=member, kind=kind)
        self.health = health_
        self.metrics = metrics
        self._topics = ", ".join(topics)
        self._revoked_at: float | None = time.monotonic()  # see joining()
        self._tasks: list[asyncio.Task[None]] = []

    def joining(self) -> None:
        """The consumer subscribes: the first join counts as a rebalance too."""
        self._revoked_at = time.monotonic()

    def revoked(self) -> None:
        """A rebalance began: not ready until the new assignment arrives."""
        self._revoked_at = time.monotonic()
        self.health.set("group", False, "rebalancing")

    def assigned(self, partitions: Iterable[tuple[str, int]]) -> None:
        """The new assignment: metrics, registry entry and readiness follow it."""
        took = time.monotonic() - self._revoked_at if self._revoked_at is not None else 0.0
        self._revoked_at = None
        mine = set(partitions)
        self.metrics.assigned(mine, rebalance_s=took)
        self.registration.assigned(mine)
        self.health.set("group", True, f"{len(mine)} partitions of {self._topics}")
        logger.info("partitions assigned after %.1fs: %s", took, describe(mine))

    def start(self, redis: Any, *, checks: Mapping[str, health.Check] | None = None) -> None:
        """Beat and PING ``redis`` for readiness, and publish the registry entry, as tasks."""
        self.registration.redis = redis
        self._tasks = [
            asyncio.create_task(
                health.watch(self.health, redis=redis, checks=checks), name="health"
            ),
            asyncio.create_task(self.registration.run(), name="group-registry"),
        ]

    async def run(self, redis: Any) -> None:
        """:meth:`start`, then until cancelled; leaves the group registry when it ends."""
        self.start(redis)
        try:
            await asyncio.gather(*self._tasks)
        finally:
            await self.leave(what=f"{self.registration.kind} worker")

    async def leave(self, *, what: str) -> None:
        """Stop the tasks and withdraw the registry entry."""
        await cancel_and_wait(self._tasks, what=what)
        self._tasks = []
        if self.registration.redis is not None:
            await self.registration.withdraw()
            self.registration.redis = None
