"""Stopping a worker's background tasks: cancel, and cancel again until they end.

One cancellation is not enough on Python 3.11: ``asyncio.wait_for`` returns the result instead
of raising ``CancelledError`` when the cancellation lands in the loop iteration in which the
awaited thing completes (cpython gh-86296, fixed in 3.12), and redis-py's asyncio client sends
every command through ``wait_for`` when it has a socket timeout (ours always has). A loop that
polls Redis then runs on with the cancellation spent, and a ``stop`` that awaits it hangs (a
scoring worker that could not reach Kafka hung in its stop instead of exiting)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

logger = logging.getLogger(__name__)


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[object]],
    *,
    what: str,
    timeout_s: float = 10.0,
    every_s: float = 0.2,
) -> None:
    """Cancel ``tasks`` and wait until they have ended, cancelling the ones still running
    every ``every_s``; after ``timeout_s`` a task that still runs is logged and left (its
    owner stops anyway). An exception a task ended with is logged: a stop is no time to raise."""
    every = set(tasks)
    pending = {task for task in every if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    rounds = 0
    while pending:
        if rounds:
            logger.debug(
                "%s: %s still running after a cancellation (one can be lost); cancelling again",
                what,
                ", ".join(sorted(task.get_name() for task in pending)),
            )
        rounds += 1
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(
            pending, timeout=max(0.0, min(every_s, deadline - loop.time()))
        )
        if pending and loop.time() >= deadline:
            logger.warning(
                "%s: %s still running %.0fs after being cancelled; left behind",
                what,
                ", ".join(sorted(task.get_name() for task in pending)),
                timeout_s,
            )
            break
    for task in every - pending:
        if not task.cancelled() and task.exception() is not None:
            logger.warning("%s: task %s had failed: %r", what, task.get_name(), task.exception())
