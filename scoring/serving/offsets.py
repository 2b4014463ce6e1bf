"""What a scoring worker may commit: the offsets of answered batches, and rewinds.

A batch's offsets become committable only once every reply of it was acknowledged by the
broker (:meth:`OffsetBook.answered`). When producing fails, the batch is rewound: the consumer
seeks back to its first offsets (:func:`rewind_targets`), and :attr:`OffsetBook.rewinds` grows,
so a batch that was fetched before the rewind knows its records come again and must not commit
(a batch fetched after it commits normally). Pure bookkeeping, no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from aiokafka import TopicPartition

Offsets = dict[TopicPartition, int]


class OffsetBook:
    """Answered offsets per partition (the next offset to commit), and a rewind counter."""

    def __init__(self, *, commit_interval_s: float) -> None:
        self._answered: Offsets = {}
        self._interval_s = commit_interval_s
        self._last_take = float("-inf")  # the first commit is never held back
        self.rewinds = 0

    def answered(self, records: Sequence[Any]) -> None:
        """Every record of ``records`` was answered: their offsets may be committed."""
        for tp, last in last_offsets(records).items():
            self._answered[tp] = max(self._answered.get(tp, 0), last + 1)

    def rewound(self) -> None:
        """A failed batch rewound the consumer: batches fetched before now come again."""
        self.rewinds += 1

    @property
    def pending(self) -> bool:
        """Something answered is not committed yet."""
        return bool(self._answered)

    def due(self) -> bool:
        """Whether a commit is due: something answered and the commit interval has passed (a
        commit is a broker round trip; committing less often only repeats replies after a
        crash, it never loses a request)."""
        return bool(self._answered) and time.monotonic() - self._last_take >= self._interval_s

    def take(self) -> Offsets:
        """What to commit now (and forget it: a failed commit is not retried, the replies are
        out and clients drop duplicates)."""
        offsets, self._answered = self._answered, {}
        self._last_take = time.monotonic()
        return offsets


def rewind_targets(first: Offsets, positions: Offsets) -> Offsets:
    """Where a failed batch seeks back to: its first offsets on the partitions still assigned
    (those in ``positions``), but never forward: when the batch before failed too, it already
    rewound further back, and seeking past that would skip its records for good."""
    return {
        tp: offset for tp, offset in first.items() if tp in positions and positions[tp] > offset
    }


def first_offsets(records: Sequence[Any]) -> Offsets:
    """The lowest offset of ``records`` per partition."""
    out: Offsets = {}
    for r in records:
        tp = TopicPartition(r.topic, r.partition)
        out[tp] = min(out.get(tp, r.offset), r.offset)
    return out


def last_offsets(records: Sequence[Any]) -> Offsets:
    """The highest offset of ``records`` per partition."""
    out: Offsets = {}
    for r in records:
        tp = TopicPartition(r.topic, r.partition)
        out[tp] = max(out.get(tp, r.offset), r.offset)
    return out
