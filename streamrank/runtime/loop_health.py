"""What stalls a worker's event loop: how late its timers fire, and the garbage collector's
pauses. Both are observed into histograms of the worker's metrics (:class:`GroupMetrics`)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

LAG_INTERVAL_S = 0.05  # how often the loop's lag is sampled
Observe = Callable[[float], None]
GcHook = Callable[[str, dict[str, Any]], None]


async def watch_loop_lag(observe: Observe, *, interval_s: float = LAG_INTERVAL_S) -> None:
    """Sleep ``interval_s`` again and again and observe how much later than asked each wake-up
    came (seconds): the time the loop spent running something else without yielding."""
    while True:
        asked = time.perf_counter()
        await asyncio.sleep(interval_s)
        observe(max(0.0, time.perf_counter() - asked - interval_s))


class GcPauses:
    """A ``gc.callbacks`` hook that observes each collection's pause (seconds) by generation;
    ``install`` and ``remove`` it (``with`` does both)."""

    def __init__(self, observe: Callable[[int, float], None]) -> None:
        self._observe = observe
        self._started: float | None = None
        self._hook: GcHook = self

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._observe(int(info["generation"]), time.perf_counter() - self._started)
            self._started = None

    def install(self, wrap: Callable[[GcHook], GcHook] | None = None) -> None:
        """Add the hook to ``gc.callbacks``, as ``wrap(self)`` when given."""
        if self._hook not in gc.callbacks:
            self._hook = self if wrap is None else wrap(self)
            gc.callbacks.append(self._hook)

    def remove(self) -> None:
        if self._hook in gc.callbacks:
            gc.callbacks.remove(self._hook)

    def __enter__(self) -> GcPauses:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def freeze_start_up_objects() -> int:
    """Move every object alive now (modules, the model, clients) to the collector's permanent
    generation, so that later full collections do not walk them again; returns how many."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("froze %d start-up objects out of the garbage collector's scans", frozen)
    return frozen
