"""One batch of click records -> Redis (one round trip) + dead letters + re-keyed forwards.

Item records (the ``items`` topic) in the batch go to the item attribute table in the same
round trip's wake (:mod:`streams.items`); their dead letters join the clicks'.

``FeatureProcessor.process(records)`` returns only once every effect of the batch is durable:
the Redis script ran and every dead letter / forwarded click was acknowledged by the broker
(so a batch replayed after a failed produce may dead-letter or forward a click twice: the
dead-letter topic is at-least-once too, and a twice-forwarded click is deduplicated).
The caller (the Faust worker) acks the records, and so lets their offsets be committed, only
after that: at-least-once. While Redis or Kafka does not answer, ``process`` retries the same
batch with exponential back-off (logging once when the outage starts and once when it ends),
so nothing is committed and nothing is lost; replays are harmless because the script applies
each event_id once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from schemas import Limits, peek_field
from streamrank import clock
from streamrank.errors import DependencyUnavailable, KafkaUnavailable
from streamrank.kafka import clients as kafka
from streamrank.redis.client import redis_client, slot_grouping
from streamrank.runtime import logs
from streamrank.settings import Settings
from streams.classify import Classified, Record, classify
from streams.items import ItemWriter, decode_items, split_items
from streams.metrics import FeatureMetrics
from streams.windows import windows_from_settings
from streams.writer import BatchCalls, BatchWriter, assemble

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What happened to one batch."""

    records: int
    applied: int
    duplicates: int
    forwarded: int
    dead_lettered: int


class FeatureProcessor:
    """Applies batches of click records; owns its Redis client and Kafka producer."""

    def __init__(
        self,
        *,
        settings: Settings,
        metrics: FeatureMetrics,
        redis: Any = None,
        producer: AIOKafkaProducer | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._limits = Limits.from_settings(settings.limits)
        self._windows = windows_from_settings(settings.features)
        self._owns_redis = redis is None
        if redis is None:
            redis = redis_client(settings.redis, timeout_s=settings.features.redis_timeout_s)
        self._redis = redis
        # Created on first use: aiokafka binds its client to the running loop.
        self._producer = producer
        self._owns_producer = producer is None
        self._producer_started = producer is not None
        self._writer = BatchWriter(
            redis=self._redis,
            wait_replicas=settings.redis.wait_replicas,
            wait_timeout_ms=settings.redis.wait_timeout_ms,
        )
        self._items = ItemWriter(redis=self._redis)
        self._slot_of = slot_grouping(self._redis)
        self._down: dict[str, float] = {}
        self.stopping = False

    async def start(self) -> None:
        await self._retry("kafka", self._ensure_producer)

    async def _ensure_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            self._producer = kafka.producer(self._settings.kafka, acks="all", linger_ms=2)
        if not self._producer_started:
            try:
                await self._producer.start()
            except KafkaError as exc:
                raise KafkaUnavailable(f"cannot start the Kafka producer: {exc}") from exc
            self._producer_started = True
        return self._producer

    async def stop(self) -> None:
        self.stopping = True
        if self._owns_producer and self._producer is not None and self._producer_started:
            await self._producer.stop()
        if self._owns_redis:
            await self._redis.aclose()

    async def __aenter__(self) -> FeatureProcessor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def process(self, records: Sequence[Record]) -> BatchOutcome:
        """Apply one batch; returns when all its effects are durable (see the module doc)."""
        started = time.perf_counter()
        now_ms = clock.now_ms()
        item_records, clicks = split_items(records, self._settings.topics.items)
        classified, batch = self._prepare(clicks, now_ms)
        items = decode_items(item_records, limits=self._limits, now_ms=now_ms)
        classified.dead.extend(items.dead)
        classified.skipped += items.skipped
        applied = 0
        if classified.apply:
            applied = await self._retry("redis", lambda: self._timed_apply(batch))
        if items.events:
            written = await self._retry("redis", lambda: self._items.apply(items.events))
            self._metrics.items_written.inc(written)
            self._metrics.items_stale.inc(len(items.events) - written)
        if classified.dead or classified.forward:
            await self._retry(
                "kafka",
                lambda: self._produce(classified),
            )
        duplicates = len(classified.apply) - applied + classified.in_batch_duplicates
        self._count(records, classified, batch, applied=applied, duplicates=duplicates)
        _log_dead_letters(classified)
        if logger.isEnabledFor(logging.DEBUG):
            _log_clicks(classified, records=len(records), applied=applied)
        self._observe_times(records, classified, started)
        return BatchOutcome(
            len(records), applied, duplicates, len(classified.forward), len(classified.dead)
        )

    def _prepare(self, records: Sequence[Record], now_ms: int) -> tuple[Classified, BatchCalls]:
        """Sort the records into apply / dead / forward and build the batch's Redis calls."""
        settings = self._settings
        classified = classify(
            records, limits=self._limits, now_ms=now_ms, max_skew_s=settings.limits.max_event_skew_s
        )
        batch = assemble(
            classified.apply,
            now_ms=now_ms,
            windows=self._windows,
            lateness_s=settings.features.counter_lateness_s,
            sequence_length=settings.features.sequence_length,
            sequence_ttl_s=settings.features.sequence_ttl_s,
            dedupe_ttl_s=settings.features.dedupe_ttl_s,
            slot_of=self._slot_of,
            contract=settings.features.write_contract,
        )
        return classified, batch

    def _count(
        self,
        records: Sequence[Record],
        classified: Classified,
        batch: BatchCalls,
        *,
        applied: int,
        duplicates: int,
    ) -> None:
        """The batch's event counters (one per fate) and its size."""
        m = self._metrics
        m.batch_size.observe(len(records))
        m.events_applied.inc(applied)
        m.events_duplicate.inc(duplicates)
        m.events_forwarded.inc(len(classified.forward))
        m.events_too_old.inc(batch.too_old_for_counters)
        for reason, _letter in classified.dead:
            m.dead_letters.labels(reason).inc()
        m.skipped_records.inc(classified.skipped)

    def _observe_times(
        self, records: Sequence[Record], classified: Classified, started: float
    ) -> None:
        """Event-time lag, batch duration and broker-append-to-durable latency."""
        m = self._metrics
        if classified.apply:
            newest = max(event.ts for event in classified.apply)
            m.event_time_lag.set(max(0.0, time.time() - newest / 1000))
        m.batch_seconds.observe(time.perf_counter() - started)
        stamps = [r.timestamp_s for r in records if r.timestamp_s]
        if stamps:
            m.append_to_durable.observe(max(0.0, time.time() - min(stamps)))

    async def _timed_apply(self, batch: BatchCalls) -> int:
        with self._metrics.redis_write_seconds.time():
            return await self._writer.apply(batch)

    async def _produce(self, classified: Classified) -> None:
        """Dead letters, and the unkeyed clicks re-keyed by user_id (with their headers)."""
        settings = self._settings
        producer = await self._ensure_producer()
        try:
            futures = [
                await producer.send(settings.topics.dead_letters, letter.to_json())
                for _reason, letter in classified.dead
            ]
            futures += [
                await producer.send(
                    settings.topics.clicks,
                    raw,
                    key=event.user_id.encode(),
                    headers=list(headers) or None,
                )
                for event, raw, headers in zip(
                    classified.forward,
                    classified.forward_raw,
                    classified.forward_headers,
                    strict=True,
                )
            ]
            await asyncio.gather(*futures)
        except KafkaError as exc:
            raise KafkaUnavailable(f"could not produce dead letters/forwards: {exc}") from exc

    async def _retry(self, dependency: str, action: Callable[[], Awaitable[T]]) -> T:
        """Run ``action`` until it succeeds, backing off while ``dependency`` is down."""
        delay = 0.05
        cause = ""
        while True:
            try:
                result = await action()
            except DependencyUnavailable as exc:
                if self.stopping:
                    raise
                if dependency not in self._down:
                    self._down[dependency] = time.monotonic()
                    self._metrics.dependency(dependency, False)
                    logger.warning(
                        "%s is unavailable (%s); retrying the batch with back-off, offsets are "
                        "not committed until it succeeds",
                        dependency,
                        exc,
                    )
                elif type(exc.__cause__).__name__ != cause:
                    # The outage changed its nature (refused -> LOADING -> READONLY ...): say so.
                    logger.info("%s is still unavailable, now: %s", dependency, exc)
                cause = type(exc.__cause__).__name__
                self._metrics.retries.labels(dependency).inc()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._settings.features.retry_max_s)
                continue
            if dependency in self._down:
                outage = time.monotonic() - self._down.pop(dependency)
                self._metrics.dependency(dependency, True)
                logger.info(
                    "%s is back after %.1fs; the batch was applied, resuming", dependency, outage
                )
            return result


def _log_dead_letters(classified: Classified) -> None:
    for reason, letter in classified.dead:
        logger.info(
            "dead-lettered %s[%s]@%s: %s",
            letter.source_topic,
            letter.partition,
            letter.offset,
            letter.error,
            extra={
                **logs.record_fields(letter.source_topic, letter.partition, letter.offset),
                "user_id": peek_field(letter.payload, "user_id"),
                "event_id": peek_field(letter.payload, "event_id"),
                "reason": reason,
            },
        )


def _log_clicks(classified: Classified, *, records: int, applied: int) -> None:
    """One debug line per re-keyed click and per applied click (with its source offset)."""
    for event in classified.forward:
        logger.debug(
            "re-keyed click %s of user %s",
            event.event_id,
            event.user_id,
            extra={"user_id": event.user_id, "event_id": event.event_id},
        )
    for event, (topic, partition, offset) in zip(
        classified.apply, classified.applied_at, strict=True
    ):
        logger.debug(
            "click %s of user %s at %s[%s]@%s in a batch of %d (%d applied, the rest seen before)",
            event.event_id,
            event.user_id,
            topic,
            partition,
            offset,
            records,
            applied,
            extra={
                **logs.record_fields(topic, partition, offset),
                "user_id": event.user_id,
                "event_id": event.event_id,
                "item_id": event.item_id,
            },
        )
