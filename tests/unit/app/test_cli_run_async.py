"""One Ctrl-C ends a command even when its first cancellation is lost (what asyncio.wait_for
does on Python 3.11 when the cancellation lands as a Redis reply completes: streamrank.runtime.tasks)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from workbench.cli.common import run_async


def test_one_ctrl_c_ends_a_command_that_loses_its_first_cancellation() -> None:
    lost = 0

    async def watch_loop() -> None:
        nonlocal lost
        asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGINT)
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                if lost == 0:
                    lost += 1  # swallowed, as wait_for can
                    continue
                raise

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_async(watch_loop())
    assert lost == 1
    assert time.monotonic() - started < 10
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_command_that_finishes_returns_its_result() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert run_async(answer()) == 42
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
