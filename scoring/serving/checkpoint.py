"""The scoring worker's produce-then-commit path: a batch's replies are produced and every
acknowledgement awaited before its offsets are marked answered; answered offsets are committed
at most every ``scoring_commit_interval_ms`` (and when asked). If producing fails, the consumer
seeks back to the batch's first offsets, so every request is answered at least once (clients
drop duplicate replies)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from scoring.serving.offsets import OffsetBook, first_offsets, last_offsets, rewind_targets
from scoring.serving.outgoing import Outgoing
from streamrank.runtime.group_metrics import GroupMetrics, commit_offsets, report_lag

logger = logging.getLogger(__name__)

REWIND_PAUSE_S = 0.5  # after a failed produce, before the batch is fetched again


class Checkpoint:
    """Owns the offsets of one consumer: what was answered, what is committed, and rewinds."""

    def __init__(
        self,
        *,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        metrics: GroupMetrics,
        commit_interval_s: float,
    ) -> None:
        self._consumer = consumer
        self._producer = producer
        self._metrics = metrics
        self._book = OffsetBook(commit_interval_s=commit_interval_s)
        self._holding = False  # a revoke is committing: batches only record their offsets

    @property
    def rewinds(self) -> int:
        """How many times a failed batch rewound the consumer (a batch fetched before the
        latest rewind does not commit)."""
        return self._book.rewinds

    @property
    def pending(self) -> bool:
        """Something answered is not committed yet."""
        return self._book.pending

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Within: answered batches only record their offsets; whoever holds commits."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False

    async def produce(
        self, outgoing: Sequence[Outgoing], records: Sequence[ConsumerRecord[Any, Any]]
    ) -> bool:
        """Send everything and await the acknowledgements; on failure rewind the batch."""
        try:
            futures = [await self._producer.send(o.topic, o.value, key=o.key) for o in outgoing]
            await asyncio.gather(*futures)
            return True
        except KafkaError as exc:
            logger.error(
                "producing %d replies failed (%s); rewinding the batch to answer it again",
                len(outgoing),
                exc,
            )
            await self._rewind(records)
            return False

    async def _rewind(self, records: Sequence[ConsumerRecord[Any, Any]]) -> None:
        self._book.rewound()
        first = first_offsets(records)
        positions: dict[TopicPartition, int] = {}
        for tp in first:
            # revoked: its new owner resumes from the last commit, before these records
            with contextlib.suppress(IllegalStateError):
                positions[tp] = await self._consumer.position(tp)
        for tp, offset in rewind_targets(first, positions).items():
            self._consumer.seek(tp, offset)
        await asyncio.sleep(REWIND_PAUSE_S)

    async def answered(self, records: Sequence[ConsumerRecord[Any, Any]]) -> None:
        """Mark a batch answered; commit what is answered when a commit is due."""
        self._book.answered(records)
        if self._book.due() and not self._holding:
            await self.commit()

    async def commit(self) -> None:
        """Commit the offsets of every batch answered so far."""
        offsets = self._book.take()
        # Partitions that moved away since: their new owner answers from the last commit.
        assigned = self._consumer.assignment()
        offsets = {tp: offset for tp, offset in offsets.items() if tp in assigned}
        if not offsets:
            return
        # The replies are out; after a failed commit another member may answer these again,
        # which clients tolerate (duplicates are dropped).
        await commit_offsets(
            self._consumer, offsets, metrics=self._metrics,
            if_failed="some requests may be answered twice",
        )  # fmt: skip

    def observe_lag(self, records: Sequence[ConsumerRecord[Any, Any]]) -> None:
        """Requests behind each partition's high watermark once this batch is answered."""
        report_lag(
            last_offsets(records),
            assigned=self._consumer.assignment(),
            highwater=self._consumer.highwater,
            on_lag=self._metrics.set_lag,
        )
