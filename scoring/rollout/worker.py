"""``streamrank worker outcomes``: the Kafka shell around the outcome join (:mod:`.join`).

Its own consumer group (``outcomes_group_id``) on the served log and the clicks, so it scales
and fails apart from the features and scoring workers, and can be left out where nobody needs
online metrics; its lifecycle is the shared one (:mod:`streamrank.runtime.worker`). Per
fetched batch: decode (a bad served record goes to the dead-letter topic; bad clicks are the
features worker's to dead-letter, counted here), one join-script call, the dead letters
acknowledged, then the offsets committed. A Redis outage holds the batch and
retries it with back-off; the join is idempotent, so a batch redelivered after a crash applies
nothing twice. Two background tasks: the closer (final outcomes, to ``outcomes_topic`` when
set) and the exporter of the online metrics (Prometheus gauges per version and window).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from prometheus_client import CollectorRegistry

from schemas import ClickEvent, DeadLetter, Limits, decode_click
from scoring.rollout.cycles import recent_cycles
from scoring.rollout.join import JoinConfig, OutcomeStore, assemble, require_single_redis
from scoring.rollout.metrics import OutcomeMetrics
from scoring.rollout.online import WINDOWS, Window, read_summaries, recent_versions
from scoring.rollout.records import Served, decode_served, outcome_record
from streamrank import clock, keys
from streamrank.errors import (
    INTERNAL_RECORD_ERROR,
    UNDECODABLE_BATCH,
    ConfigError,
    ContractError,
    RedisUnavailable,
    internal_error,
)
from streamrank.kafka.guard import UndecodableBatch
from streamrank.redis.client import redis_client
from streamrank.runtime.health import Health
from streamrank.runtime.worker import GroupWorker
from streamrank.runtime.worker import serve as serve_worker
from streamrank.settings import Settings

logger = logging.getLogger(__name__)

READY = "outcomes worker consuming"  # workbench.devstack.processes waits for it
CLAIM_VISIBILITY_MS = 30_000  # a claimed record comes back to any closer after this long
CLOSE_BATCH = 500
READY_CHECKS = ("group", "redis")  # what /readyz waits for


class OutcomesWorker(GroupWorker):
    """Join served records with clicks; ``async with`` or ``start``/``run``/``stop``."""

    kind = "outcomes"
    metrics: OutcomeMetrics

    def __init__(
        self,
        *,
        settings: Settings,
        registry: CollectorRegistry | None = None,
        clock_ms: Callable[[], int] = clock.now_ms,
        close_every_s: float = 1.0,
        export_every_s: float | None = None,
        health: Health | None = None,
    ) -> None:
        if not settings.topics.served_log:
            raise ConfigError(
                "the outcomes worker reads the served log: set STREAMRANK_SERVED_LOG_TOPIC (the "
                "same topic the scoring workers write to)"
            )
        require_single_redis(settings.redis)
        super().__init__(
            settings=settings,
            metrics=OutcomeMetrics(registry),
            health=health if health is not None else Health(READY_CHECKS),
            group=settings.outcomes.group_id,
            topics=[settings.topics.served_log, settings.topics.clicks],
        )
        self.config = JoinConfig.from_settings(settings)
        self._limits = Limits.from_settings(settings.limits)
        self._actions = frozenset(settings.outcomes.actions)
        self._clock = clock_ms
        self._close_every_s = close_every_s
        self._export_every_s = (
            settings.outcomes.export_interval_s if export_every_s is None else export_every_s
        )
        self._store: OutcomeStore | None = None
        self.batches = 0

    @property
    def store(self) -> OutcomeStore:
        assert self._store is not None, "start() first"
        return self._store

    # --- the lifecycle's parts (streamrank.runtime.worker) ---------------------------------

    async def open(self) -> Any:
        redis = redis_client(self.settings.redis, timeout_s=self.settings.outcomes.redis_timeout_s)
        self._store = OutcomeStore(redis=redis)
        return redis

    def kafka_clients(self) -> tuple[AIOKafkaProducer, AIOKafkaConsumer]:
        return self.group_clients(max_poll_records=self.settings.outcomes.batch_max)

    def kafka_starters(
        self, producer: AIOKafkaProducer, consumer: AIOKafkaConsumer
    ) -> list[Callable[[], Awaitable[Any]]]:
        from streamrank.kafka.topics import create_topics

        s = self.settings
        wanted = (*self.topics, s.topics.dead_letters) + (
            (s.topics.outcomes,) if s.topics.outcomes else ()
        )
        return [producer.start, lambda: create_topics(s, topics=wanted), consumer.start]

    def background(self) -> dict[str, Coroutine[Any, Any, None]]:
        jobs = {"closer": self._every(self._close_every_s, self.close_due)}
        if self._export_every_s > 0:
            jobs["exporter"] = self._every(self._export_every_s, self.export_metrics)
        return jobs

    def announce(self) -> None:
        s = self.settings
        logger.info(
            "%s %s and %s as group %s (window %ss, close delay %ss, buckets of %ss; outcomes to "
            "%s)",
            READY,
            s.topics.served_log,
            s.topics.clicks,
            self.group,
            s.outcomes.window_s,
            s.outcomes.close_delay_s,
            s.outcomes.bucket_s,
            s.topics.outcomes or "no topic",
        )

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Consume until :meth:`request_stop` (or cancellation)."""
        assert self._consumer is not None
        while not self.stopping:
            got = await self._consumer.getmany(
                timeout_ms=200, max_records=self.settings.outcomes.batch_max
            )
            records = [r for part in got.values() for r in part]
            if records and await self.process(records):
                await self.commit_records(records, if_failed="the batch may be read again")

    async def process(self, records: Sequence[ConsumerRecord[Any, Any]]) -> bool:
        """Join one batch and dead-letter its bad served records; False when stopped before
        the effects were applied (the records come again)."""
        served, clicks, letters = self._triage(records)
        call = assemble(served, clicks, config=self.config, now_ms=self._clock())
        delay = 0.1
        failing = False
        while True:
            try:
                counts = await self.store.apply(call)
                break
            except RedisUnavailable as exc:
                self.metrics.redis_errors.inc()
                if not failing:
                    logger.warning("%s; retrying with back-off", exc)
                    failing = True
                if self.stopping:
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.features.retry_max_s)
        if failing:
            logger.info("Redis answers again; the outcome join continues")
        self.metrics.observe_join(counts)
        if letters:
            await self.produce_dead_letters(letters)
        self.batches += 1
        return True

    def _triage(
        self, records: Sequence[ConsumerRecord[Any, Any]]
    ) -> tuple[list[Served], list[ClickEvent], list[tuple[bytes, bytes]]]:
        s = self.settings
        served: list[Served] = []
        clicks: list[ClickEvent] = []
        letters: list[tuple[bytes, bytes]] = []
        horizon = self._clock() - self.config.window_ms - self.config.close_delay_ms
        for record in records:
            if record.topic == s.topics.served_log:
                try:
                    served.append(self._decode_served(record))
                except Exception as exc:
                    error = exc if isinstance(exc, ContractError) else internal_error(exc)
                    self.metrics.dead_letters.labels(error.reason).inc()
                    logger.info(
                        "dead-lettering %s[%s]@%s: %s",
                        record.topic,
                        record.partition,
                        record.offset,
                        error,
                    )
                    letter = DeadLetter.rejected(record, error, at=self._clock())
                    letters.append((record.key or b"", letter.to_json()))
                continue
            try:
                click = self._decode_click(record)
            except Exception as exc:
                reason = exc.reason if isinstance(exc, ContractError) else INTERNAL_RECORD_ERROR
                self.metrics.skipped_clicks.labels(reason).inc()
                continue
            if click.action not in self._actions:
                self.metrics.clicks.labels("ignored").inc()
            elif click.ts < horizon:
                self.metrics.clicks.labels("stale").inc()
            else:
                clicks.append(click)
        return served, clicks, letters

    def _decode_served(self, record: ConsumerRecord[Any, Any]) -> Served:
        if isinstance(record.value, UndecodableBatch):
            raise ContractError(
                record.value.describe(record.topic, record.partition), reason=UNDECODABLE_BATCH
            )
        return decode_served(record.value)

    def _decode_click(self, record: ConsumerRecord[Any, Any]) -> ClickEvent:
        if isinstance(record.value, UndecodableBatch):
            raise ContractError("undecodable click batch", reason=UNDECODABLE_BATCH)
        return decode_click(record.value, self._limits)

    # --- background tasks -------------------------------------------------------------------

    async def _every(self, seconds: float, job: Callable[[], Any]) -> None:
        while not self.stopping:
            await asyncio.sleep(seconds)
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except RedisUnavailable as exc:
                self.metrics.redis_errors.inc()
                logger.warning("%s", exc)
            except Exception:
                logger.exception("outcomes worker background job failed; it runs again")

    async def close_due(self) -> int:
        """Make the outcomes whose window closed final (produce them, then remove them)."""
        closed = 0
        while True:
            now = self._clock()
            claimed = await self.store.claim_due(
                now_ms=now, limit=CLOSE_BATCH, visibility_ms=CLAIM_VISIBILITY_MS
            )
            if not claimed:
                return closed
            topic = self.settings.topics.outcomes
            if topic:
                assert self._producer is not None
                futures = [
                    await self._producer.send(
                        topic,
                        orjson.dumps(outcome_record(u, r, pending, closed_at=now)),
                        key=r.encode(),
                    )
                    for u, r, pending in claimed
                    if pending is not None
                ]
                await asyncio.gather(*futures)  # a failure leaves them claimed: they come back
            await self.store.finish([(u, r) for u, r, _ in claimed])
            self.metrics.closed.inc(sum(1 for *_, p in claimed if p is not None))
            closed += len(claimed)
            if len(claimed) < CLOSE_BATCH:
                return closed

    async def export_metrics(self) -> None:
        """The online gauges of every version that served in the last hour."""
        redis = self._redis
        assert redis is not None
        now = self._clock()
        versions = await recent_versions(redis, since_ms=now - max(WINDOWS.values()) * 1000)
        summaries = {}
        for name, seconds in WINDOWS.items():
            window = Window.trailing(seconds, now_ms=now, bucket_s=self.config.bucket_s)
            for version, summary in (await read_summaries(redis, versions, window)).items():
                summaries[(version, name)] = summary
        self.metrics.export(summaries)
        self.metrics.open_records.set(await redis.zcard(keys.outcome_due()))
        self.metrics.export_cycles(await recent_cycles(redis, 20))


def serve(settings: Settings, *, metrics_port: int | None = None) -> None:
    """Run one outcomes worker in this process until a signal stops it (its metrics and health
    endpoints on ``metrics_port``)."""
    serve_worker(
        OutcomesWorker(settings=settings, registry=CollectorRegistry()), metrics_port=metrics_port
    )
