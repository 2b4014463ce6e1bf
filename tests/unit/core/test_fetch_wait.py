"""The fetch-wait policy: doubled while records wait unread, halved back towards the configured
wait once it has held for a while, held longer each time the lower wait starves at once."""

from __future__ import annotations

from aiokafka import TopicPartition

from streamrank.kafka.fetch_wait import (
    CEILING_MS,
    MAX_RELAX_AFTER_S,
    RELAX_AFTER_S,
    STALL_S,
    Wait,
    next_wait,
    stall_limit_s,
    waiting_records,
)

T0 = 1000.0


def test_starving_doubles_the_wait_up_to_the_ceiling() -> None:
    assert next_wait(Wait(2, T0), floor_ms=2, starving=True, now=T0).wait_ms == 4
    assert next_wait(Wait(0, T0), floor_ms=0, starving=True, now=T0).wait_ms == 1  # 0 moves too
    assert next_wait(Wait(400, T0), floor_ms=2, starving=True, now=T0).wait_ms == CEILING_MS
    at_ceiling = Wait(CEILING_MS, T0)
    assert next_wait(at_ceiling, floor_ms=2, starving=True, now=T0).wait_ms == CEILING_MS


def test_a_raised_wait_is_halved_towards_the_floor_after_it_held() -> None:
    held = T0 + RELAX_AFTER_S
    assert next_wait(Wait(16, T0), floor_ms=2, starving=False, now=held - 0.1).wait_ms == 16
    lowered = next_wait(Wait(16, T0), floor_ms=2, starving=False, now=held)
    assert (lowered.wait_ms, lowered.changed_at, lowered.lowered) == (8, held, True)
    assert next_wait(Wait(3, T0), floor_ms=2, starving=False, now=held).wait_ms == 2
    assert next_wait(Wait(2, T0), floor_ms=2, starving=False, now=held).wait_ms == 2  # the floor


def test_a_lowered_wait_that_starves_holds_the_higher_one_twice_as_long() -> None:
    wait = Wait(4, T0)
    relaxes = []
    for _ in range(12):  # the broker needs 3-4 ms: every try at 2 ms starves
        wait = next_wait(wait, floor_ms=2, starving=False, now=wait.changed_at + wait.relax_after_s)
        assert wait.wait_ms == 2
        wait = next_wait(wait, floor_ms=2, starving=True, now=wait.changed_at + STALL_S)
        assert wait.wait_ms == 4 and not wait.lowered
        relaxes.append(wait.relax_after_s)
    assert relaxes[:3] == [2 * RELAX_AFTER_S, 4 * RELAX_AFTER_S, 8 * RELAX_AFTER_S]
    assert relaxes[-1] == MAX_RELAX_AFTER_S
    # starving while raised (not just after lowering) raises without lengthening the hold
    assert next_wait(Wait(4, T0), floor_ms=2, starving=True, now=T0).relax_after_s == RELAX_AFTER_S


def test_starving_means_records_unread_for_the_stall_or_ten_waits() -> None:
    assert stall_limit_s(2) == STALL_S  # a short wait: the fixed stall
    assert stall_limit_s(100) == 1.0  # a long one: ten of its fetches


def test_waiting_records_counts_what_lies_between_position_and_end() -> None:
    a, b, c = (TopicPartition("t", p) for p in range(3))
    # c's end is unknown (no fetch answered yet); a broker's short end offset counts 0, not less
    assert waiting_records({a: 10, b: 5}, {a: 7, b: 6, c: 0}) == 3
    assert waiting_records({}, {a: 7}) == 0
