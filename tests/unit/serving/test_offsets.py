"""What a scoring worker may commit, and where a failed batch seeks back to (pure logic)."""

from __future__ import annotations

from aiokafka import TopicPartition

from scoring.serving.offsets import OffsetBook, first_offsets, last_offsets, rewind_targets

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


class Record:
    def __init__(self, partition: int, offset: int) -> None:
        self.topic, self.partition, self.offset = "rank-requests", partition, offset


def test_answered_offsets_are_committed_once_as_the_next_offset_per_partition() -> None:
    book = OffsetBook(commit_interval_s=0.0)
    assert not book.due() and book.take() == {}
    book.answered([Record(0, 7), Record(0, 5), Record(1, 2)])
    book.answered([Record(0, 3)])  # an older batch answered late never moves a partition back
    assert book.due()
    assert book.take() == {P0: 8, P1: 3}
    assert not book.due() and book.take() == {}


def test_commits_wait_for_the_interval() -> None:
    book = OffsetBook(commit_interval_s=3600.0)
    book.answered([Record(0, 1)])
    assert book.due()  # the first commit is never held back
    book.take()
    book.answered([Record(0, 2)])
    assert not book.due()  # within the interval: held, and committed at the next due time


def test_a_rewind_is_counted_and_first_and_last_offsets_are_per_partition() -> None:
    book = OffsetBook(commit_interval_s=0.0)
    book.rewound()
    book.rewound()
    assert book.rewinds == 2
    records = [Record(0, 9), Record(1, 4), Record(0, 3), Record(1, 6)]
    assert first_offsets(records) == {P0: 3, P1: 4}
    assert last_offsets(records) == {P0: 9, P1: 6}


def test_pending_says_whether_anything_answered_is_uncommitted() -> None:
    book = OffsetBook(commit_interval_s=3600)
    assert not book.pending
    book.answered([Record(0, 5)])
    assert book.pending and book.take() == {TopicPartition("rank-requests", 0): 6}
    assert not book.pending
