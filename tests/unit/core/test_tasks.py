"""Stopping background tasks: a cancellation that a task loses (Python 3.11's ``wait_for``
returning a result instead) is repeated until the task ends; a task that never ends is left
with a warning, not waited for forever."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from streamrank.runtime.tasks import cancel_and_wait


async def test_a_task_that_lost_its_cancellation_is_cancelled_again() -> None:
    for turns in range(4):  # the cancel lands 0..3 loop iterations after the poll answers
        answered = asyncio.Event()

        async def poll(answered: asyncio.Event = answered) -> str:
            await answered.wait()
            return "pong"

        async def loop(answered: asyncio.Event = answered) -> None:
            while True:
                await asyncio.wait_for(poll(), 5)  # on 3.11 this can swallow a cancellation
                answered.clear()
                await asyncio.sleep(0.01)
                answered.set()

        task = asyncio.create_task(loop())
        await asyncio.sleep(0.02)
        answered.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        await cancel_and_wait([task], what="test", timeout_s=5, every_s=0.05)
        assert task.cancelled(), turns


async def test_a_task_that_never_ends_is_left_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="streamrank.runtime.tasks"):
        await cancel_and_wait([task], what="test worker", timeout_s=0.3, every_s=0.05)
    assert not task.done()
    assert "test worker: stubborn still running" in caplog.text and "left behind" in caplog.text
    release.set()
    await task


async def test_a_task_that_failed_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(broken(), name="broken")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="streamrank.runtime.tasks"):
        await cancel_and_wait([task], what="test worker")
    assert "task broken had failed: RuntimeError('boom')" in caplog.text
