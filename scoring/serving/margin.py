"""How much time a request must have left to be worth its batch's Redis round trip.

Every Redis wait of a batch is bounded by the batch's earliest deadline, so one request about
to expire must not cut its whole batch short. A request with less time left than Redis usually
takes is answered ``expired`` at once; and since that guess runs short when Redis slows down,
a deadline bounds the wait only down to ``min_wait_ms`` (half the budget): a request left in
between is answered late rather than cost its batch-mates their scores. Why both rules:
docs/reliability.md#requests-near-their-deadline.
"""

from __future__ import annotations


class DeadlineMargin:
    """``factor`` x the recent Redis time of a batch (an exponential moving average of what
    :meth:`observe` is told), at most ``cap_ms`` (a slow Redis must not expire every request);
    0 until Redis has answered once."""

    def __init__(self, *, cap_ms: float, factor: float = 2.0, alpha: float = 0.1) -> None:
        self._cap_ms = cap_ms
        self._factor = factor
        self._alpha = alpha
        self._average_ms: float | None = None

    def observe(self, redis_ms: float) -> None:
        """A batch's Redis time (its sequence fetch and embedding lookups), in ms."""
        average = self._average_ms
        self._average_ms = (
            redis_ms if average is None else average + self._alpha * (redis_ms - average)
        )

    @property
    def min_wait_ms(self) -> float:
        """The least time a batch's Redis wait is given, whatever its earliest deadline."""
        return self._cap_ms

    @property
    def ms(self) -> float:
        if self._average_ms is None:
            return 0.0
        return min(self._cap_ms, self._factor * self._average_ms)
