"""A worker run until a signal: the first SIGTERM asks for a graceful stop, a second one
cancels; without a graceful handler the first one cancels."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from streamrank.runtime.signals import run_until_signalled


def test_the_first_signal_stops_gracefully_and_a_second_cancels() -> None:
    graceful: list[str] = []
    stopping = asyncio.Event()

    async def worker() -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        await stopping.wait()  # finishing what is in flight, then:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(30)
        return "not cancelled"

    def on_signal(task: asyncio.Task[Any]) -> None:
        graceful.append(task.get_name())
        stopping.set()

    assert run_until_signalled(worker(), on_signal=on_signal) is None
    assert len(graceful) == 1


def test_without_a_graceful_handler_a_signal_cancels() -> None:
    async def worker() -> str:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(30)
        return "not cancelled"

    assert run_until_signalled(worker()) is None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C as before


def test_a_worker_that_returns_gives_its_result() -> None:
    async def worker() -> str:
        return "done"

    assert run_until_signalled(worker()) == "done"


def test_sigusr1_logs_every_task_stack_and_goes_on(caplog: Any) -> None:
    async def parked() -> None:
        await asyncio.Event().wait()

    async def worker() -> str:
        reader = asyncio.create_task(parked(), name="parked-reader")
        await asyncio.sleep(0)
        os.kill(os.getpid(), signal.SIGUSR1)
        await asyncio.sleep(0.05)  # the handler runs on the loop
        reader.cancel()
        return "still running"

    with caplog.at_level("WARNING", logger="streamrank"):
        assert run_until_signalled(worker()) == "still running"
    dump = "\n".join(r.getMessage() for r in caplog.records)
    assert "--- parked-reader" in dump and "in parked" in dump  # the task and where it waits
