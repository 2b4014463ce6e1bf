"""How much time a request must have left to be worth its batch's Redis round trip.

Every Redis wait of a batch is bounded by the batch's earliest deadline. A request that arrives
a moment before its deadline would bound that wait to almost nothing, and the whole batch would
be cut short and answered degraded although Redis answered in its usual time: seen after a
scoring-worker failover, where one batch of the dead worker's backlog gave 27 requests with
seconds left a ``redis_unavailable`` reply because one of them had a millisecond left. A request
with less time left than Redis usually takes is answered ``expired`` at once instead.

That guess can be short when Redis is slower than usual (a survivor taking over a dead worker's
partitions: bigger batches on a loaded host), so one request's deadline may also bound its
batch's wait only down to ``min_wait_ms`` after the batch arrived (the cap, half the budget): a
request with less time left than that is answered late (scored) if Redis takes longer than its
deadline, instead of costing its batch-mates their scores (the same failover test failed so in
a clean-clone CI run: 31 requests ``redis_unavailable`` behind one with a few ms left).
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
