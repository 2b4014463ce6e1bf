"""Each cascade stage's time: its own budget, cut by the request's deadline less what the stages
after it must have (the deep model has a rung of its own, the coarse order, so no time is set
aside for it); and running a CPU-bound stage on a worker thread that the stage stops waiting
for when its time is up (faiss and torch release the GIL, so the event loop keeps serving)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from streamrank.settings import CascadeSettings

T = TypeVar("T")

STAGES = ("retrieval", "filter", "coarse", "rank", "rerank")  # in the order they run
# Stages that can be skipped without losing the reply (rank -> the coarse order): an earlier
# stage does not go short to keep time for them.
SKIPPABLE = frozenset({"rank"})


@dataclass(frozen=True, slots=True)
class StageBudgets:
    """Milliseconds per stage (:data:`STAGES`)."""

    ms: Mapping[str, float]

    @classmethod
    def from_settings(cls, cascade: CascadeSettings) -> StageBudgets:
        return cls(dict(cascade.budgets_ms()))

    def after(self, stage: str) -> float:
        """What the stages after ``stage`` must have, ms (the skippable ones: nothing)."""
        later = STAGES[STAGES.index(stage) + 1 :]
        return sum(self.ms[s] for s in later if s not in SKIPPABLE)

    def allowance_ms(self, stage: str, *, now_ms: float, deadline_ms: float) -> float:
        """The time ``stage`` may take from ``now_ms``: its budget, or less when the deadline
        leaves less once the later stages' needs are set aside; 0 = no time at all."""
        left = deadline_ms - now_ms - self.after(stage)
        return max(0.0, min(self.ms[stage], left))


async def in_thread(call: Callable[[], T], *, timeout_s: float) -> T:
    """``call()`` on the loop's default executor, waited for at most ``timeout_s``.

    Raises ``TimeoutError`` past it (or at once when ``timeout_s`` <= 0, without starting the
    call). A call that is still running then finishes on its thread and its result is dropped:
    a thread cannot be stopped, only no longer waited for."""
    if timeout_s <= 0:
        raise TimeoutError("no time left for the stage")
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(loop.run_in_executor(None, call), timeout_s)


def until(end: float) -> Callable[[], asyncio.Timeout]:
    """A bound for an await: ``async with until(end)():`` raises ``TimeoutError`` at ``end``
    (a ``time.perf_counter`` value)."""
    return lambda: asyncio.timeout(max(0.0, end - time.perf_counter()))


def thread_until(end: float) -> Callable[[Callable[[], T]], Awaitable[T]]:
    """Runs a call on a worker thread, waited for until ``end`` (``time.perf_counter``)."""

    async def run(call: Callable[[], T]) -> T:
        return await in_thread(call, timeout_s=end - time.perf_counter())

    return run
