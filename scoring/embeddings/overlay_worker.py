"""``streamrank embeddings upsert --topic``: a consumer that upserts rows into a table's overlay.

Its own consumer group (``overlay_group_id``); the lifecycle is the shared one
(:mod:`streamrank.runtime.worker`). Per fetched batch: decode each record as a row
(``{"id", "vector"}``, :func:`scoring.embeddings.overlay.decode_row`; a bad one goes to the
dead-letter topic with its reason), one upsert of the good rows (a new overlay id; a repeated
id: the last wins), the dead letters acknowledged, then the offsets committed. A Redis outage
holds the batch and retries it with back-off; an upsert is idempotent (the same rows again,
a new overlay id), so a batch redelivered after a crash only re-writes its rows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from prometheus_client import CollectorRegistry

from schemas import DeadLetter
from scoring.embeddings.codec import FloatMatrix
from scoring.embeddings.meta import TableMeta
from scoring.embeddings.metrics import OverlayMetrics
from scoring.embeddings.overlay import UpsertReport, decode_row
from scoring.embeddings.store import EmbeddingStore
from streamrank import clock
from streamrank.errors import UNDECODABLE_BATCH, ContractError, RedisUnavailable, internal_error
from streamrank.kafka.guard import UndecodableBatch
from streamrank.redis.client import redis_client
from streamrank.runtime.health import Health
from streamrank.runtime.worker import GroupWorker
from streamrank.settings import Settings

logger = logging.getLogger(__name__)

READY = "overlay worker consuming"  # workbench.devstack.processes waits for it
BATCH_MAX = 500


class OverlayWorker(GroupWorker):
    """Upsert the rows of ``topic`` into the overlay of ``version``/``table``."""

    kind = "overlay"
    metrics: OverlayMetrics

    def __init__(
        self,
        *,
        settings: Settings,
        version: str,
        table: str,
        topic: str,
        registry: CollectorRegistry | None = None,
        health: Health | None = None,
        clock_ms: Callable[[], int] = clock.now_ms,
    ) -> None:
        super().__init__(
            settings=settings,
            metrics=OverlayMetrics(registry),
            health=health if health is not None else Health(("group", "redis")),
            group=settings.embeddings.overlay_group_id,
            topics=[topic],
        )
        self.version, self.table = version, table
        self._clock = clock_ms
        self._store: EmbeddingStore | None = None
        self._meta: TableMeta | None = None
        self.reports: list[UpsertReport] = []

    async def open(self) -> Any:
        redis = redis_client(self.settings.redis)
        self._store = EmbeddingStore(redis=redis, fetch_mode=self.settings.embeddings.fetch_mode)
        try:  # refuse at start a table that is not published (UnknownVersion says which are)
            self._meta = await self._store.table_meta(self.version, self.table)
        except BaseException:
            await redis.aclose()
            raise
        return redis

    def kafka_clients(self) -> tuple[AIOKafkaProducer, AIOKafkaConsumer]:
        return self.group_clients(max_poll_records=BATCH_MAX)

    def kafka_starters(
        self, producer: AIOKafkaProducer, consumer: AIOKafkaConsumer
    ) -> list[Callable[[], Awaitable[Any]]]:
        from streamrank.kafka.topics import create_topics

        wanted = (*self.topics, self.settings.topics.dead_letters)
        return [
            producer.start,
            lambda: create_topics(self.settings, topics=wanted),
            consumer.start,
        ]

    def announce(self) -> None:
        logger.info(
            "%s %s into the overlay of %s/%s as group %s",
            READY,
            self.topics[0],
            self.version,
            self.table,
            self.group,
        )

    async def run(self) -> None:
        """Consume until :meth:`request_stop` (or cancellation)."""
        assert self._consumer is not None
        while not self.stopping:
            got = await self._consumer.getmany(timeout_ms=200, max_records=BATCH_MAX)
            records = [r for part in got.values() for r in part]
            if records and await self.process(records):
                await self.commit_records(records, if_failed="the rows may be upserted again")

    def triage(
        self, records: Sequence[ConsumerRecord[Any, Any]]
    ) -> tuple[dict[str, FloatMatrix], list[tuple[bytes, bytes]]]:
        """The batch's good rows by id (the last of a repeated id) and its dead letters."""
        assert self._meta is not None
        rows: dict[str, FloatMatrix] = {}
        letters: list[tuple[bytes, bytes]] = []
        max_id = self.settings.limits.max_id_length
        for record in records:
            try:
                if isinstance(record.value, UndecodableBatch):
                    raise ContractError(
                        record.value.describe(record.topic, record.partition),
                        reason=UNDECODABLE_BATCH,
                    )
                if record.value is None:
                    raise ContractError("record has no value (null payload)", reason="empty")
                item, row = decode_row(
                    record.value,
                    dim=self._meta.dim,
                    encoding=self._meta.encoding,
                    max_id_length=max_id,
                )
                rows[item] = row
            except Exception as exc:
                error = exc if isinstance(exc, ContractError) else internal_error(exc)
                self.metrics.dead_letters.labels(error.reason).inc()
                logger.info(
                    "dead-lettering %s[%s]@%s: %s", record.topic, record.partition, record.offset,
                    error,
                )  # fmt: skip
                letter = DeadLetter.rejected(record, error, at=self._clock())
                letters.append((record.key or b"", letter.to_json()))
        return rows, letters

    async def process(self, records: Sequence[ConsumerRecord[Any, Any]]) -> bool:
        """Upsert one batch and dead-letter its bad rows; False when stopped before the rows
        were written (the records come again)."""
        assert self._store is not None
        rows, letters = self.triage(records)
        delay = 0.1
        while rows:
            try:
                report = await self._store.upsert(
                    self.table, list(rows), np.stack(list(rows.values())), version=self.version
                )
            except RedisUnavailable as exc:
                self.metrics.redis_errors.inc()
                logger.warning("%s; retrying with back-off", exc)
                if self.stopping:
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.features.retry_max_s)
                continue
            self.metrics.upserts.inc()
            self.metrics.upserted_rows.inc(report.rows)
            self.reports.append(report)
            break
        if letters:
            await self.produce_dead_letters(letters)
        return True
