"""Running a long-lived coroutine until SIGINT or SIGTERM: the workers' graceful stop, and the
tools' (``tail``, ``top``, ``dlq`` ...) clean one."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("streamrank")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_until_signalled(
    coro: Any, *, on_signal: Callable[[asyncio.Task[Any]], None] | None = None
) -> Any:
    """Run ``coro`` in a new event loop; SIGINT (Ctrl-C) or SIGTERM cancel it, so its
    ``finally`` blocks stop what it started (None is returned then). Explicit handlers, because
    a process started in the background inherits an ignored SIGINT and would never see Ctrl-C as
    KeyboardInterrupt.

    ``on_signal(task)``, when given, handles the first signal instead (a graceful stop: finish
    what is in flight, then return); a second signal cancels."""

    async def main() -> Any:
        task = asyncio.ensure_future(coro)
        loop = asyncio.get_running_loop()
        signals = 0

        def handle() -> None:
            nonlocal signals
            signals += 1
            if on_signal is not None and signals == 1:
                logger.info("stopping gracefully (a second signal stops at once)")
                on_signal(task)
            else:
                # Once: a worker's own stop runs in its finally blocks and must not be cut
                # short; if the cancellation is lost (streamrank.runtime.tasks), a second
                # signal ends it.
                task.cancel()

        for sig in SIGNALS:
            loop.add_signal_handler(sig, handle)
        try:
            return await task
        except asyncio.CancelledError:
            logger.info("stopped by signal")
            return None
        finally:
            for sig in SIGNALS:
                loop.remove_signal_handler(sig)

    return asyncio.run(main())
