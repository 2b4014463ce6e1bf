"""The scoring worker's consumer-group rebalance listener: commit what was answered before a
partition moves.

aiokafka calls :meth:`on_partitions_revoked` when this member's partitions are about to be
taken away (another worker joined or left, or this one is rejoining) and awaits it before
rejoining. The listener lets the batches in flight finish (their replies are produced) and
commits every answered offset, so the partition's next owner starts right after the last
answered request instead of answering the uncommitted ones again (duplicate replies). If this
member was already evicted, the commit fails (``CommitFailedError``): the new owner then
answers those requests again, which clients tolerate.

:meth:`on_partitions_assigned` runs the hooks given to the constructor (``on_assigned``):
the place to publish or record an assignment.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from aiokafka import ConsumerRebalanceListener, TopicPartition

logger = logging.getLogger(__name__)

Partitions = frozenset[TopicPartition]
AssignedHook = Callable[[Partitions], Awaitable[None] | None]


def describe(partitions: Iterable[TopicPartition]) -> str:
    """``rank-requests[0,1,3]``: partitions grouped by topic, for log lines."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    if not by_topic:
        return "nothing"
    return " ".join(f"{t}[{','.join(map(str, sorted(p)))}]" for t, p in sorted(by_topic.items()))


class CommitOnRevoke(ConsumerRebalanceListener):
    """``consumer.subscribe([topic], listener=CommitOnRevoke(finish=worker.finish_inflight))``.

    ``finish`` lets the batches in flight complete and commits every answered offset (the
    worker bounds how long it waits). ``on_assigned`` hooks run after each assignment."""

    def __init__(
        self,
        *,
        finish: Callable[[], Awaitable[None]],
        on_assigned: Iterable[AssignedHook] = (),
    ) -> None:
        self._finish = finish
        self._on_assigned = list(on_assigned)
        self.revocations = 0
        self.assignments = 0
        self.assigned: Partitions = frozenset()

    def add_assigned_hook(self, hook: AssignedHook) -> None:
        self._on_assigned.append(hook)

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        revoked = frozenset(revoked)
        if not revoked:
            return  # the first join: nothing was held
        self.revocations += 1
        started = time.monotonic()
        # aiokafka logs (and swallows) what a listener raises; finish() logs its own failures.
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
        logger.info("partitions assigned: %s", describe(self.assigned))
        for hook in self._on_assigned:
            result = hook(self.assigned)
            if inspect.isawaitable(result):
                await result
