"""Running a long-lived coroutine until SIGINT or SIGTERM: the workers' graceful stop, and the
tools' (``tail``, ``top``, ``dlq`` ...) clean one."""

from __future__ import annotations

import asyncio
import io
import logging
import signal
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("streamrank")

SIGNALS = (signal.SIGINT, signal.SIGTERM)
DUMP_SIGNAL = signal.SIGUSR1  # `kill -USR1 <pid>`: log where every task of the loop waits


def task_stacks(loop: asyncio.AbstractEventLoop) -> str:
    """Every pending task of ``loop`` with the stack it is suspended in (an asyncio thread dump)."""
    out = io.StringIO()
    tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    out.write(f"{len(tasks)} tasks\n")
    for task in tasks:
        out.write(f"--- {task.get_name()}: {task.get_coro()!r}\n")
        task.print_stack(file=out)
    return out.getvalue()


def run_until_signalled(
    coro: Any, *, on_signal: Callable[[asyncio.Task[Any]], None] | None = None
) -> Any:
    """Run ``coro`` in a new event loop; SIGINT (Ctrl-C) or SIGTERM cancel it, so its
    ``finally`` blocks stop what it started (None is returned then). Explicit handlers, because
    a process started in the background inherits an ignored SIGINT and would never see Ctrl-C as
    KeyboardInterrupt.

    ``on_signal(task)``, when given, handles the first signal instead (a graceful stop: finish
    what is in flight, then return); a second signal cancels. SIGUSR1 logs every task's stack
    (:func:`task_stacks`) and goes on."""

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
        loop.add_signal_handler(DUMP_SIGNAL, lambda: logger.warning("%s", task_stacks(loop)))
        try:
            return await task
        except asyncio.CancelledError:
            logger.info("stopped by signal")
            return None
        finally:
            for sig in (*SIGNALS, DUMP_SIGNAL):
                loop.remove_signal_handler(sig)

    return asyncio.run(main())
