"""``streamrank worker outcomes``: the Kafka shell around the outcome join (:mod:`.join`).

Its own consumer group (``outcomes_group_id``) on the served log and the clicks, so it scales
and fails apart from the features and scoring workers, and can be left out where nobody needs
online metrics. Per fetched batch: decode (a bad served record goes to the dead-letter topic;
bad clicks are the features worker's to dead-letter, counted here), one join-script call, the
dead letters acknowledged, then the offsets committed. A Redis outage holds the batch and
retries it with back-off; the join is idempotent, so a batch redelivered after a crash applies
nothing twice. Two background tasks: the closer (final outcomes, to ``outcomes_topic`` when
set) and the exporter of the online metrics (Prometheus gauges per version and window).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.errors import CommitFailedError, KafkaError
from prometheus_client import CollectorRegistry

from schemas import ClickEvent, DeadLetter, Limits, decode_click
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
    KafkaUnavailable,
    RedisUnavailable,
    internal_error,
)
from streamrank.kafka import clients as kafka
from streamrank.kafka.guard import UndecodableBatch
from streamrank.redis.client import redis_client
from streamrank.runtime import groups, health, tasks
from streamrank.runtime.health import Health
from streamrank.settings import Settings

logger = logging.getLogger(__name__)

READY = "outcomes worker consuming"  # workbench.devstack.processes waits for it
CLAIM_VISIBILITY_MS = 30_000  # a claimed record comes back to any closer after this long
CLOSE_BATCH = 500
READY_CHECKS = ("group", "redis")  # what /readyz waits for


class _Membership(ConsumerRebalanceListener):
    """Readiness and the group registry follow the assignment (aiokafka's public hook)."""

    def __init__(self, health: Health, registration: groups.Registration) -> None:
        self._health = health
        self._registration = registration

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._health.set("group", False, "rebalancing")

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        partitions = {(tp.topic, tp.partition) for tp in assigned}
        self._registration.assigned(partitions)
        self._health.set("group", True, f"{len(partitions)} partitions")
        logger.info(
            "partitions assigned: %s",
            ",".join(f"{t}[{p}]" for t, p in sorted(partitions)) or "none",
        )


class OutcomesWorker:
    """Join served records with clicks; ``async with`` or ``start``/``run``/``stop``."""

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
        self.settings = settings
        self.metrics = OutcomeMetrics(registry)
        self.health = health if health is not None else Health(READY_CHECKS)
        self.client_id = groups.client_id("outcomes", settings.kafka.group_instance_id)
        self._registration: groups.Registration | None = None
        self.config = JoinConfig.from_settings(settings)
        self._limits = Limits.from_settings(settings.limits)
        self._actions = frozenset(settings.outcomes.actions)
        self._clock = clock_ms
        self._close_every_s = close_every_s
        self._export_every_s = (
            settings.outcomes.export_interval_s if export_every_s is None else export_every_s
        )
        self._redis: aioredis.Redis | None = None
        self._store: OutcomeStore | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.batches = 0

    @property
    def store(self) -> OutcomeStore:
        assert self._store is not None, "start() first"
        return self._store

    async def start(self) -> None:
        s = self.settings
        assert s.topics.served_log is not None
        from streamrank.kafka.topics import create_topics

        self._redis = redis_client(s.redis, timeout_s=s.outcomes.redis_timeout_s)
        self._store = OutcomeStore(redis=self._redis)
        topics = [s.topics.served_log, s.topics.clicks]
        self._producer = kafka.producer(s.kafka, acks="all", linger_ms=5)
        self._registration = groups.Registration(
            redis=self._redis, group=s.outcomes.group_id, member=self.client_id, kind="outcomes"
        )
        self._consumer = kafka.consumer(
            s.kafka,
            group_id=s.outcomes.group_id,
            client_id=self.client_id,
            **kafka.group_kwargs(s.kafka),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=s.outcomes.batch_max,
        )
        self._consumer.subscribe(topics, listener=_Membership(self.health, self._registration))
        try:
            wanted = (*topics, s.topics.dead_letters) + (
                (s.topics.outcomes,) if s.topics.outcomes else ()
            )
            await create_topics(s, topics=wanted)
            await self._producer.start()
            await self._consumer.start()
        except KafkaError as exc:
            await self.stop()
            raise KafkaUnavailable(
                f"cannot reach Kafka at {s.kafka.bootstrap}: {exc}; is the stack up?"
            ) from exc
        self._tasks = [
            asyncio.create_task(self._every(self._close_every_s, self.close_due), name="closer"),
            asyncio.create_task(health.watch(self.health, redis=self._redis), name="health"),
            asyncio.create_task(self._registration.run(), name="group-registry"),
        ]
        if self._export_every_s > 0:
            self._tasks.append(
                asyncio.create_task(
                    self._every(self._export_every_s, self.export_metrics), name="exporter"
                )
            )
        logger.info(
            "%s %s and %s as group %s (window %ss, close delay %ss, buckets of %ss; outcomes to "
            "%s)",
            READY,
            s.topics.served_log,
            s.topics.clicks,
            s.outcomes.group_id,
            s.outcomes.window_s,
            s.outcomes.close_delay_s,
            s.outcomes.bucket_s,
            s.topics.outcomes or "no topic",
        )

    async def stop(self) -> None:
        self._stopping.set()
        # A cancellation that lands inside a Redis read can come out as redis-py's
        # TimeoutError, which the loop survives (it also stops on _stopping), or be lost
        # (streamrank.runtime.tasks): cancelled again until it ends, and not waited for forever.
        await tasks.cancel_and_wait(self._tasks, what="outcomes worker", timeout_s=5)
        self._tasks = []
        for client in (self._consumer, self._producer):
            if client is not None:
                with contextlib.suppress(Exception):  # stopping: nothing left to lose
                    await client.stop()
        if self._registration is not None:
            await self._registration.withdraw()
            self._registration = None
        if self._redis is not None:
            await self._redis.aclose()
        self._consumer = self._producer = self._redis = None

    async def __aenter__(self) -> OutcomesWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def request_stop(self) -> None:
        self._stopping.set()

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Consume until :meth:`request_stop` (or cancellation)."""
        assert self._consumer is not None
        while not self._stopping.is_set():
            got = await self._consumer.getmany(
                timeout_ms=200, max_records=self.settings.outcomes.batch_max
            )
            records = [r for part in got.values() for r in part]
            if records and await self.process(records):
                await self._commit(records)

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
                if self._stopping.is_set():
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.features.retry_max_s)
        if failing:
            logger.info("Redis answers again; the outcome join continues")
        self.metrics.observe_join(counts)
        if letters:
            await self._produce(letters)
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

    async def _produce(self, letters: Sequence[tuple[bytes, bytes]]) -> None:
        """Dead letters, acknowledged; retried while the broker is away (the join is applied
        and idempotent, so waiting here loses nothing)."""
        assert self._producer is not None
        delay = 0.2
        while True:
            try:
                futures = [
                    await self._producer.send(self.settings.topics.dead_letters, value, key=key)
                    for key, value in letters
                ]
                await asyncio.gather(*futures)
                return
            except KafkaError as exc:
                logger.warning("producing %d dead letters failed (%s); retrying", len(letters), exc)
                if self._stopping.is_set():
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _commit(self, records: Sequence[ConsumerRecord[Any, Any]]) -> None:
        assert self._consumer is not None
        offsets: dict[TopicPartition, int] = {}
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:
            # Applied already; a redelivery after a rebalance is a no-op (idempotent join).
            logger.warning("offset commit failed (%s); the batch may be read again", exc)

    # --- background tasks -------------------------------------------------------------------

    async def _every(self, seconds: float, job: Callable[[], Any]) -> None:
        while not self._stopping.is_set():
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
        assert self._redis is not None
        now = self._clock()
        versions = await recent_versions(self._redis, since_ms=now - max(WINDOWS.values()) * 1000)
        summaries = {}
        for name, seconds in WINDOWS.items():
            window = Window.trailing(seconds, now_ms=now, bucket_s=self.config.bucket_s)
            for version, summary in (await read_summaries(self._redis, versions, window)).items():
                summaries[(version, name)] = summary
        self.metrics.export(summaries)
        self.metrics.open_records.set(await self._redis.zcard(keys.outcome_due()))
