"""The hot-item pool: the most clicked items of a recent window, re-read in the background.

The retrieval fallback of last resort: :meth:`HotPool.items` answers from memory, never waits
for Redis, and keeps the last snapshot it read while Redis is down (a failed refresh is
counted, and logged at most every ``log_every_s``). Each refresh reads the item counters'
window as of the clock's now (:class:`streams.hot_items.HotItemsReader`: the closed buckets,
best first, ties by id). A pool of size 0 never reads.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from scoring.serving.metrics import ScoringMetrics
from streamrank import clock as wall_clock
from streamrank.errors import DependencyUnavailable
from streamrank.redis import errors as redis_errors
from streamrank.runtime import tasks

logger = logging.getLogger(__name__)

# A refresh that fails for these is an outage (logged without a traceback), anything else a bug.
OUTAGES: tuple[type[BaseException], ...] = (
    DependencyUnavailable,
    asyncio.TimeoutError,
    *redis_errors.TRANSIENT,
)


class HotSource(Protocol):
    """Where the pool reads from (:class:`streams.hot_items.HotItemsReader`)."""

    async def hot_items(
        self, window: str, *, as_of_ms: int, n: int
    ) -> Sequence[tuple[str, int]]: ...


class HotPool:
    """``items()``: the ``size`` most clicked items of ``window`` as of the latest refresh."""

    def __init__(
        self,
        *,
        reader: HotSource,
        window: str,
        size: int,
        refresh_s: float,
        clock: Callable[[], int] = wall_clock.now_ms,
        metrics: ScoringMetrics | None = None,
        log_every_s: float = 30.0,
    ) -> None:
        self._reader = reader
        self.window = window
        self.size = size
        self.refresh_s = refresh_s
        self._clock = clock
        self._metrics = metrics
        self._log_every_ms = log_every_s * 1000
        self._items: tuple[str, ...] = ()
        self.as_of_ms: int | None = None  # the as-of time of the snapshot (None: none yet)
        self._read_at_ms: int | None = None  # when the snapshot was read
        self._started_ms = clock()
        self._logged_ms: float = -math.inf
        self._attempted_ms: int | None = None  # when the latest refresh began
        self._lock = asyncio.Lock()  # one refresh at a time: the reader keeps state
        self.failures = 0  # failed refreshes in a row
        self._task: asyncio.Task[None] | None = None
        if metrics is not None:
            metrics.hot_pool_age.set_function(self.age_s)

    def items(self) -> tuple[str, ...]:
        """The latest snapshot, best first; empty before the first successful refresh."""
        return self._items

    def age_s(self) -> float:
        """Seconds since the snapshot was read (since the pool was made, while it has none)."""
        since = self._read_at_ms if self._read_at_ms is not None else self._started_ms
        return max(0.0, (self._clock() - since) / 1000)

    async def refresh(self) -> bool:
        """Read the window as of now and swap the snapshot: True when it did. A failure keeps
        the last snapshot, is counted and logged (at most every ``log_every_s``), and returns
        False."""
        if self.size <= 0:
            return False
        async with self._lock:
            now = self._attempted_ms = self._clock()
            started = time.perf_counter()
            try:
                found = await self._reader.hot_items(self.window, as_of_ms=now, n=self.size)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(exc, now)
                return False
        self._items = tuple(item for item, _clicks in found)
        self.as_of_ms = self._read_at_ms = now
        if self.failures:
            logger.info(
                "hot-item pool refreshed again after %d failed refreshes (%d items)",
                self.failures,
                len(self._items),
            )
        self.failures = 0
        if self._metrics is not None:
            self._metrics.hot_pool_items.set(len(self._items))
            self._metrics.hot_pool_refresh.observe(time.perf_counter() - started)
        return True

    def _failed(self, exc: Exception, now: int) -> None:
        self.failures += 1
        if self._metrics is not None:
            self._metrics.hot_pool_failures.inc()
        if now - self._logged_ms < self._log_every_ms:
            return
        self._logged_ms = now
        args = (self.window, self.failures, len(self._items), self.age_s(), exc)
        message = (
            "hot-item pool refresh of the %s window failed (%d in a row); serving the last "
            "snapshot (%d items, %.0f s old): %s"
        )
        if isinstance(exc, OUTAGES):
            logger.warning(message, *args)
        else:  # not an outage: a bug or bad data, with its traceback
            logger.error(message, *args, exc_info=exc)

    async def run(self) -> None:
        """Refresh every ``refresh_s`` (counted from the latest refresh) until cancelled."""
        while True:
            if self._attempted_ms is not None:
                since_s = (self._clock() - self._attempted_ms) / 1000
                await asyncio.sleep(min(self.refresh_s, max(0.0, self.refresh_s - since_s)))
            await self.refresh()

    @property
    def running(self) -> bool:
        """Whether the background refresh runs."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Refresh in the background (not for a pool of size 0)."""
        if self._task is None and self.size > 0:
            self._task = asyncio.create_task(self.run(), name="scoring-hot-pool")

    async def stop(self) -> None:
        if self._task is not None:
            await tasks.cancel_and_wait([self._task], what="hot-item pool")
            self._task = None
