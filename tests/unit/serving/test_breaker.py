"""The Redis circuit breaker's state machine, on a controlled clock."""

from __future__ import annotations

from scoring.serving.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_opens_after_n_failures_in_a_row_then_probes_after_cooldown() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=3, cooldown_s=2.0, clock=clock)
    breaker.record_failure()
    breaker.record_success()  # resets the run
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    clock.t = 1.9
    assert not breaker.allow()
    clock.t = 2.0
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # only one probe at a time
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()


def test_failed_probe_reopens_for_a_full_cooldown() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=1, cooldown_s=1.0, clock=clock)
    breaker.record_failure()
    clock.t = 1.0
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    clock.t = 1.5
    assert not breaker.allow()
    clock.t = 2.0
    assert breaker.allow()


def test_a_released_probe_lets_the_next_probe_through() -> None:
    """A probe cut short by its caller's deadline proves nothing: released, the breaker lets
    the next call probe instead of refusing every call for good."""
    clock = Clock()
    breaker = CircuitBreaker(failures=1, cooldown_s=1.0, clock=clock)
    breaker.record_failure()
    clock.t = 1.0
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.release()
    assert breaker.state is BreakerState.HALF_OPEN and breaker.allow()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
