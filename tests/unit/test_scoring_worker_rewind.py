"""Where a batch whose replies could not be produced seeks back to (pure logic)."""

from __future__ import annotations

from aiokafka import TopicPartition

from scoring.worker import rewind_targets

P0, P1, P2 = (TopicPartition("rank-requests", p) for p in range(3))


def test_a_failed_batch_seeks_back_to_its_first_offsets() -> None:
    assert rewind_targets({P0: 100, P1: 7}, {P0: 140, P1: 9}) == {P0: 100, P1: 7}


def test_never_seeks_forward_past_an_earlier_batchs_rewind() -> None:
    # Batch 1 (offsets 100..119 of P0) failed and rewound P0 to 100; batch 2 (120..139) fails
    # next: seeking P0 to 120 would skip 100..119 for good (later batches commit past them).
    assert rewind_targets({P0: 120, P1: 50}, {P0: 100, P1: 60}) == {P1: 50}
    assert rewind_targets({P0: 120}, {P0: 120}) == {}  # already there


def test_revoked_partitions_are_left_to_their_new_owner() -> None:
    assert rewind_targets({P0: 5, P2: 3}, {P0: 9}) == {P0: 5}
