"""The fetch-wait policy: doubled while records wait unread, halved back towards the configured
wait once it has held for a while, never above aiokafka's default."""

from __future__ import annotations

from aiokafka import TopicPartition

from streamrank.kafka.fetch_wait import (
    CEILING_MS,
    RELAX_AFTER_S,
    STALL_S,
    next_wait,
    stall_limit_s,
    waiting_records,
)

T0 = 1000.0


def test_starving_doubles_the_wait_up_to_the_ceiling() -> None:
    assert next_wait(2, floor_ms=2, starving=True, now=T0, changed_at=T0) == 4
    assert next_wait(0, floor_ms=0, starving=True, now=T0, changed_at=T0) == 1  # 0 moves too
    assert next_wait(400, floor_ms=2, starving=True, now=T0, changed_at=T0) == CEILING_MS
    assert next_wait(CEILING_MS, floor_ms=2, starving=True, now=T0, changed_at=T0) == CEILING_MS


def test_a_raised_wait_is_halved_towards_the_floor_after_it_held() -> None:
    held = T0 + RELAX_AFTER_S
    assert next_wait(16, floor_ms=2, starving=False, now=held - 0.1, changed_at=T0) == 16
    assert next_wait(16, floor_ms=2, starving=False, now=held, changed_at=T0) == 8
    assert next_wait(3, floor_ms=2, starving=False, now=held, changed_at=T0) == 2
    assert next_wait(2, floor_ms=2, starving=False, now=held, changed_at=T0) == 2  # never below


def test_starving_means_records_unread_for_the_stall_or_ten_waits() -> None:
    assert stall_limit_s(2) == STALL_S  # a short wait: the fixed stall
    assert stall_limit_s(100) == 1.0  # a long one: ten of its fetches


def test_waiting_records_counts_what_lies_between_position_and_end() -> None:
    a, b, c = (TopicPartition("t", p) for p in range(3))
    # c's end is unknown (no fetch answered yet); a broker's short end offset counts 0, not less
    assert waiting_records({a: 10, b: 5}, {a: 7, b: 6, c: 0}) == 3
    assert waiting_records({}, {a: 7}) == 0
