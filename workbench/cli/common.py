"""What every command module shares: JSON output, running coroutines, the ``worker KIND``
subparsers, and settings from flags."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import orjson

from streamrank.runtime import tasks
from streamrank.settings import Settings

Handler = Callable[[argparse.Namespace, Settings], int]


def json_bytes(value: Any) -> bytes:
    """One indented JSON document (numpy values as numbers), as the commands print it."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)


def print_json(value: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json_bytes(value).decode())
    sys.stdout.write("\n")
    sys.stdout.flush()


def worker_kinds(sub: Any) -> Any:
    """The subparsers of ``streamrank worker KIND``, shared by the areas that add a worker kind."""
    worker = sub.choices.get("worker")
    if worker is None:
        worker = sub.add_parser("worker", help="run a worker process (features, scoring, outcomes)")
        kinds = worker.add_subparsers(dest="worker_kind", metavar="KIND")
        kinds.required = True
        worker.kinds = kinds
    return worker.kinds


def run_async(coro: Any) -> Any:
    """Run a coroutine to completion; Ctrl-C cancels it, and again every 2 s until it ends (one
    cancellation can be lost inside a Redis call: :mod:`streamrank.runtime.tasks`; asyncio.run's own
    handler cancels once, and a `lag --watch` ran on after Ctrl-C), then raises
    KeyboardInterrupt. 2 s leaves a command's own clean-up time to finish."""
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(coro)  # only the main thread gets signals

    async def main() -> Any:
        task = asyncio.ensure_future(coro)
        loop = asyncio.get_running_loop()
        stoppers: set[asyncio.Task[None]] = set()

        def handle() -> None:
            stopper = tasks.cancel_and_wait([task], what="the command", every_s=2, timeout_s=30)
            stoppers.add(loop.create_task(stopper))

        loop.add_signal_handler(signal.SIGINT, handle)
        try:
            return await task
        except asyncio.CancelledError:
            if stoppers:
                raise KeyboardInterrupt from None
            raise
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(main())


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from the environment, overridden by the flags that map onto settings (a
    command's ``setting_flags``: flag -> ``STREAMRANK_*`` variable)."""
    overrides: dict[str, Any] = {}
    for flag, variable in getattr(args, "setting_flags", {}).items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides[variable] = value
    return Settings().with_env(**overrides)
