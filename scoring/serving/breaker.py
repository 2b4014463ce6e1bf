"""A circuit breaker for Redis: stop calling a dependency that keeps failing, then probe.

closed --(``failures`` in a row)--> open --(``cooldown_s`` elapsed)--> half-open: one call is
let through as a probe; its success closes the breaker, its failure re-opens it.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable

from streamrank.errors import DependencyUnavailable
from streamrank.redis import errors as redis_errors

# What a Redis outage looks like from redis-py and the layers above it.
REDIS_FAILURES: tuple[type[BaseException], ...] = (
    DependencyUnavailable,
    asyncio.TimeoutError,
    *redis_errors.TRANSIENT,
)


class BreakerState(enum.IntEnum):
    """Numeric values are the ``scoring_breaker_state`` gauge's."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    """Counts consecutive failures; not thread-safe (one event loop owns it)."""

    def __init__(
        self, *, failures: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if failures < 1:
            raise ValueError("failures must be >= 1")
        self._threshold = failures
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._failures = 0
        self._opened_at = 0.0
        self._state = BreakerState.CLOSED
        self._probing = False

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self._cooldown_s:
            self._state = BreakerState.HALF_OPEN
            self._probing = False
        return self._state

    def allow(self) -> bool:
        """May the caller try Redis now? In half-open state only one probe at a time."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def release(self) -> None:
        """The call that was let through says nothing about the dependency (the caller's
        deadline cut it short): nothing is counted, and a probe may be let through again (a
        probe never released would keep the breaker half-open, refusing every call)."""
        self._probing = False

    def record_success(self) -> None:
        self._failures = 0
        self._probing = False
        self._state = BreakerState.CLOSED

    def record_failure(self) -> None:
        self._failures += 1
        self._probing = False
        if self._state is BreakerState.HALF_OPEN or self._failures >= self._threshold:
            self._state = BreakerState.OPEN
            self._opened_at = self._clock()
