"""``streamrank worker scoring``: the Kafka shell around :class:`scoring.serving.service.RankService`.

A consumer group on ``rank-requests`` (aiokafka: it gives direct control of micro-batching
and of when offsets are committed). Per micro-batch: decode (bad input -> dead letters plus an
error reply when the request_id can be read), rank, produce every reply, await the broker's
acknowledgements, then commit. If producing fails, the consumer seeks back to the batch start,
so a request is answered at least once (clients drop duplicate replies).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from prometheus_client import CollectorRegistry

from schemas import (
    DeadLetter,
    Limits,
    RankRequest,
    RankResult,
    decode_request,
    peek_field,
    peek_request_id,
    reasons,
)
from scoring.serving import replies
from scoring.serving.breaker import CircuitBreaker
from scoring.serving.margin import DeadlineMargin
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.offsets import OffsetBook, first_offsets, last_offsets, rewind_targets
from scoring.serving.protocols import EmbeddingSource, FeatureSource
from scoring.serving.rebalance import RebalanceListener
from scoring.serving.service import Incoming, Ranked, RankService
from scoring.serving.watcher import Loader, RecentIds, VersionWatcher
from streamrank import clock
from streamrank.errors import UNDECODABLE_BATCH, ContractError, internal_error
from streamrank.kafka import clients as kafka
from streamrank.kafka.guard import UndecodableBatch
from streamrank.redis.client import redis_client
from streamrank.runtime import groups, health, logs, tasks
from streamrank.runtime.health import Health
from streamrank.settings import ScoringSettings, Settings

logger = logging.getLogger(__name__)

READY_CHECKS = ("group", "model", "redis")  # what /readyz waits for


@dataclass(slots=True)
class _Outgoing:
    topic: str
    key: bytes
    value: bytes


@dataclass(slots=True)
class _Triage:
    """One batch after decoding: requests to rank (with their reply topics and deadlines) and
    what is answered without ranking."""

    valid: list[Incoming] = field(default_factory=list)
    records: list[ConsumerRecord[Any, Any]] = field(default_factory=list)  # aligned with valid
    topics: list[str] = field(default_factory=list)
    deadlines: list[int] = field(default_factory=list)
    outgoing: list[_Outgoing] = field(default_factory=list)


def configure_torch(scoring: ScoringSettings) -> None:
    """Torch thread pools from the settings (inter-op can only be set once per process)."""
    import torch

    torch.set_num_threads(scoring.torch_threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(scoring.torch_interop_threads)


def reply_producer(settings: Settings) -> AIOKafkaProducer:
    """The producer of replies (and dead letters): every broker acknowledgement awaited."""
    return kafka.producer(settings.kafka, acks="all", linger_ms=1)


def request_consumer(settings: Settings, *, group_id: str, client_id: str) -> AIOKafkaConsumer:
    """The consumer of rank requests, offsets committed by the worker after the replies."""
    return kafka.consumer(
        settings.kafka,
        group_id=group_id,
        client_id=client_id,
        **kafka.group_kwargs(settings.kafka),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=settings.scoring.batch_max,
        fetch_max_wait_ms=settings.scoring.fetch_wait_ms,
    )


async def next_batch(
    consumer: AIOKafkaConsumer, scoring: ScoringSettings
) -> list[ConsumerRecord[Any, Any]]:
    """Up to ``scoring.batch_max`` records: the first wait is open-ended (200 ms polls), then
    more are gathered for at most ``scoring.batch_wait_ms``."""
    got = await consumer.getmany(timeout_ms=200, max_records=scoring.batch_max)
    records = [r for part in got.values() for r in part]
    if not records or scoring.batch_wait_ms <= 0:
        return records
    deadline = time.monotonic() + scoring.batch_wait_ms / 1000
    while len(records) < scoring.batch_max:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            break
        more = await consumer.getmany(
            timeout_ms=left_ms, max_records=scoring.batch_max - len(records)
        )
        records.extend(r for part in more.values() for r in part)
    return records


def real_dependencies(
    settings: Settings, redis: aioredis.Redis, metrics: ScoringMetrics
) -> tuple[FeatureSource, EmbeddingSource, Loader]:
    """The production feature reader, cached embedding store and DIN scorer loader."""
    from scoring.embeddings.cache import CachedEmbeddings
    from scoring.embeddings.store import EmbeddingStore
    from scoring.model.registry import load_scorer_from_redis
    from streams.reader import FeatureReader

    features = FeatureReader(redis=redis, features=settings.features)
    embeddings = CachedEmbeddings.from_settings(
        store=EmbeddingStore(redis=redis), embeddings=settings.embeddings, registry=metrics.registry
    )

    async def loader(version: str) -> Any:
        scorer, config = await load_scorer_from_redis(
            redis, version, dense=settings.scoring.dense_weights
        )
        metrics.model_encoding(version, str(config.get("encoding", "unknown")))
        return scorer

    return features, embeddings, loader


class ScoringWorker:
    """Consume rank requests, reply with scores; ``async with`` or ``start``/``run``/``stop``."""

    def __init__(
        self,
        *,
        settings: Settings,
        registry: CollectorRegistry | None = None,
        features: FeatureSource | None = None,
        embeddings: EmbeddingSource | None = None,
        loader: Loader | None = None,
        health: Health | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = ScoringMetrics(registry)
        self.health = health if health is not None else Health(READY_CHECKS)
        self._group_id = settings.scoring.group_id
        self.client_id = groups.client_id("scoring", settings.kafka.group_instance_id)
        self._registration: groups.Registration | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._revoked_at: float | None = None
        self._limits = Limits.from_settings(settings.limits)
        self._injected = (features, embeddings, loader)
        self._redis: aioredis.Redis | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self.watcher: VersionWatcher | None = None
        self.service: RankService | None = None
        self._stopping = asyncio.Event()
        self._offsets = OffsetBook(commit_interval_s=settings.scoring.commit_interval_ms / 1000)
        self._inflight: collections.deque[asyncio.Task[bool]] = collections.deque()
        self._holding_commits = False  # a revoke is committing: batches only record offsets
        self.rebalance = RebalanceListener(
            finish=self.finish_inflight, on_assigned=self._on_assigned, on_revoked=self._on_revoked
        )
        self.batches = 0

    @property
    def consuming(self) -> bool:
        """Started (Kafka reached) and not stopped."""
        return self._consumer is not None and not self._stopping.is_set()

    @property
    def rewinds(self) -> int:
        """How many times a failed batch rewound the consumer (a batch fetched before the
        latest rewind does not commit)."""
        return self._offsets.rewinds

    async def start(self) -> None:
        s = self.settings
        configure_torch(s.scoring)
        # A request may wait for Redis up to its deadline (RankService bounds each wait), so the
        # socket timeout must not cut it shorter than the default budget.
        self._redis = redis_client(
            s.redis, timeout_s=max(s.redis.timeout_s, s.scoring.budget_ms / 1000)
        )
        features, embeddings, loader = self._injected
        if features is None or embeddings is None or loader is None:
            features, embeddings, loader = real_dependencies(s, self._redis, self.metrics)
        breaker = CircuitBreaker(
            failures=s.scoring.breaker_failures, cooldown_s=s.scoring.breaker_cooldown_s
        )
        recent = RecentIds(s.embeddings.cache_warm_top_k)
        self.watcher = VersionWatcher(
            redis=self._redis,
            loader=loader,
            embeddings=embeddings,
            metrics=self.metrics,
            static_split=s.scoring.canary_split,
            recent=recent,
            warm_top_k=s.embeddings.cache_warm_top_k,
            poll_s=s.scoring.poll_s,
        )
        watcher = self.watcher
        self.service = RankService(
            features=features,
            embeddings=embeddings,
            serving=lambda: watcher.current,
            breaker=breaker,
            metrics=self.metrics,
            sequence_length=s.features.sequence_length,
            forward_mode=s.scoring.forward,
            log_served=s.topics.served_log is not None,
            recent=recent,
            margin=DeadlineMargin(cap_ms=s.scoring.budget_ms / 2),
        )
        try:
            await self.watcher.refresh()
        except Exception as exc:  # Redis down at start: serve degraded until it answers
            logger.warning("could not read the model pointer at start (%s); will retry", exc)
        self.watcher.start()
        self._registration = groups.Registration(
            redis=self._redis, group=self._group_id, member=self.client_id, kind="scoring"
        )
        self._tasks = [
            asyncio.create_task(
                health.watch(self.health, redis=self._redis, checks={"model": self._model_check}),
                name="health",
            ),
            asyncio.create_task(self._registration.run(), name="group-registry"),
        ]
        self._producer = reply_producer(s)
        consumer = request_consumer(s, group_id=self._group_id, client_id=self.client_id)
        consumer.subscribe([s.topics.requests], listener=self.rebalance)
        self._revoked_at = time.monotonic()  # the first join counts as a rebalance too
        try:
            await kafka.start_with_retry(
                s.kafka, [self._producer.start, consumer.start], what="scoring worker"
            )
        except BaseException:  # not reachable in time, or stopped while waiting
            self._consumer = consumer
            await self.stop()
            raise
        self._consumer = consumer
        logger.info(
            "scoring worker consuming %s as group %s (isolation_level %s, replies compressed "
            "with %s); serving %s",
            s.topics.requests,
            self._group_id,
            consumer._isolation_level,
            s.kafka.compression,
            self.watcher.describe(),
        )

    async def stop(self) -> None:
        self._stopping.set()
        if self.watcher is not None:
            await self.watcher.stop()
        with contextlib.suppress(Exception):  # what was answered is not asked again
            await self.commit_answered()
        for client in (self._consumer, self._producer):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.stop()
        await tasks.cancel_and_wait(self._tasks, what="scoring worker")
        self._tasks = []
        if self._registration is not None:
            await self._registration.withdraw()
            self._registration = None
        if self._redis is not None:
            await self._redis.aclose()
        self._consumer = self._producer = self._redis = None

    def _model_check(self) -> tuple[bool, str]:
        serving = self.watcher.describe() if self.watcher is not None else "nothing"
        return serving != "nothing", f"serving {serving}"

    # --- group membership -------------------------------------------------------------------

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        self._revoked_at = time.monotonic()
        self.health.set("group", False, "rebalancing")

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        took = time.monotonic() - self._revoked_at if self._revoked_at is not None else 0.0
        self._revoked_at = None
        partitions = {(tp.topic, tp.partition) for tp in assigned}
        self.metrics.assigned(partitions, rebalance_s=took)
        if self._registration is not None:
            self._registration.assigned(partitions)
        self.health.set(
            "group", True, f"{len(partitions)} partitions of {self.settings.topics.requests}"
        )
        logger.info(
            "partitions assigned after %.1fs: %s",
            took,
            ",".join(f"{t}[{p}]" for t, p in sorted(partitions)) or "none",
        )

    async def __aenter__(self) -> ScoringWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def request_stop(self) -> None:
        self._stopping.set()

    # --- the loop ---------------------------------------------------------------------------

    async def _next_batch(self) -> list[ConsumerRecord[Any, Any]]:
        assert self._consumer is not None
        return await next_batch(self._consumer, self.settings.scoring)

    async def run(self) -> None:
        """Consume until :meth:`request_stop` (or cancellation).

        Up to ``scoring_pipeline_depth`` micro-batches are in flight, so one batch's compute
        overlaps the other's waits (Redis round trips, the broker's acks, the commit). All
        compute stays on the event loop thread: a forward on a second thread is slower (it
        waits for the GIL between torch ops; docs/scoring.md). Offsets are still committed in
        order: a batch commits only after the one before it did.
        """
        inflight = self._inflight
        try:
            while not self._stopping.is_set():
                while inflight and inflight[0].done():
                    inflight.popleft().result()
                if len(inflight) >= self.settings.scoring.pipeline_depth:
                    await asyncio.wait({inflight[0]})
                    continue
                rewinds = self._offsets.rewinds
                records = await self._next_batch()
                if records:
                    previous = inflight[-1] if inflight else None
                    inflight.append(
                        asyncio.create_task(self.process(records, after=previous, rewinds=rewinds))
                    )
                elif not inflight and self._offsets.pending:
                    # Idle: commit what the commit interval held back, so the group's lag
                    # reaches 0 (and a crash now repeats nothing).
                    await self.commit_answered()
            while inflight:
                await inflight.popleft()
            await self.commit_answered()
        finally:
            for task in inflight:
                task.cancel()
            inflight.clear()

    async def finish_inflight(self, timeout_s: float = 10.0) -> None:
        """Let the batches in flight finish (their replies produced and acknowledged), then
        commit every answered offset: what the rebalance listener does before partitions move.
        Waits at most ``timeout_s`` (a batch stuck longer is answered again by the new owner)."""
        self._holding_commits = True
        try:
            pending = [t for t in self._inflight if not t.done()]
            if pending:
                _done, late = await asyncio.wait(pending, timeout=timeout_s)
                if late:
                    logger.warning(
                        "%d batches still in flight after %.0fs at a rebalance; their requests "
                        "may be answered twice",
                        len(late),
                        timeout_s,
                    )
            await self.commit_answered()
        except Exception:
            logger.exception(
                "committing before a rebalance failed; some requests may be answered twice"
            )
        finally:
            self._holding_commits = False

    async def process(
        self,
        records: Sequence[ConsumerRecord[Any, Any]],
        *,
        after: asyncio.Task[bool] | None = None,
        rewinds: int | None = None,
    ) -> bool:
        """Answer one batch of records, then (once ``after``, the batch before, committed)
        commit their offsets. False when the batch was rewound to be answered again."""
        assert (
            self.service is not None and self._producer is not None and self._consumer is not None
        )
        fetched_at = self._offsets.rewinds if rewinds is None else rewinds
        triage = self._triage(records, received=clock.now_ms())
        ranked = (
            await self.service.rank(triage.valid, deadlines=triage.deadlines)
            if triage.valid
            else []
        )
        outgoing = triage.outgoing + self._replies(triage, ranked)
        produced = await self._produce(outgoing, records)
        if after is not None:
            await after  # offsets are committed in order
        if not produced or self._offsets.rewinds != fetched_at:
            # Rewound since these were fetched: they come again. A batch fetched after the
            # rewind commits normally (keying on the batch before's result stopped every
            # later commit after one failed produce).
            return False
        acked = clock.now_ms()
        for incoming in triage.valid:
            self.metrics.latency.observe(max(0.0, acked - incoming.produced_ms) / 1000.0)
        self.metrics.batch_size.observe(len(records))
        await self._commit(records)
        self._observe_lag(records)
        self.batches += 1
        return True

    def _observe_lag(self, records: Sequence[ConsumerRecord[Any, Any]]) -> None:
        """Requests behind each partition's high watermark once this batch is answered (only
        for partitions still assigned: a rebalance may have moved some while it was scored)."""
        assert self._consumer is not None
        assigned = self._consumer.assignment()
        for tp, last in last_offsets(records).items():
            if tp not in assigned:
                continue
            highwater = self._consumer.highwater(tp)
            if highwater is not None:
                self.metrics.set_lag(tp.topic, tp.partition, max(0, highwater - (last + 1)))

    def _triage(self, records: Sequence[ConsumerRecord[Any, Any]], *, received: int) -> _Triage:
        """Decode each record: a valid request is to be ranked; anything else is answered now
        (an error reply, a dead letter)."""
        s = self.settings
        out = _Triage()
        for record in records:
            try:
                request = self._decode(record)
                topic = replies.reply_topic(
                    request.reply_to, default=s.topics.results, allowed=s.topics.reply_allowed
                )
                if topic is None:
                    detail = f"reply_to {request.reply_to!r} is not in reply_topics_allowed"
                    result = replies.error_reply(
                        request.request_id,
                        request.user_id,
                        reasons.REPLY_TO_NOT_ALLOWED,
                        detail,
                        now_ms=received,
                    )
                    out.outgoing.append(self._reply(s.topics.results, result, record))
                    continue
                deadline = replies.deadline_ms(
                    request, produced_ms=int(record.timestamp), budget_ms=s.scoring.budget_ms
                )
            except Exception as exc:
                # A contract breach, or a bug of ours on input nobody foresaw: only this record
                # is dead-lettered (and answered with an error when its request_id is readable).
                error = exc if isinstance(exc, ContractError) else internal_error(exc)
                out.outgoing.extend(self._reject(record, error, received))
                continue
            out.valid.append(Incoming(request, int(record.timestamp), received))
            out.records.append(record)
            out.topics.append(topic)
            out.deadlines.append(deadline)
        return out

    def _replies(self, triage: _Triage, ranked: Sequence[Ranked]) -> list[_Outgoing]:
        """The replies of ranked requests, and their served-log records when logging."""
        log_topic = self.settings.topics.served_log
        out: list[_Outgoing] = []
        for topic, record, item in zip(triage.topics, triage.records, ranked, strict=True):
            out.append(self._reply(topic, item.result, record))
            if item.served is not None and log_topic:
                key = item.result.request_id.encode()
                out.append(_Outgoing(log_topic, key, orjson.dumps(item.served)))
        return out

    def _decode(self, record: ConsumerRecord[Any, Any]) -> RankRequest:
        if isinstance(record.value, UndecodableBatch):
            marker = record.value
            self.metrics.skipped_requests.inc(marker.last_offset - marker.first_offset + 1)
            raise ContractError(
                marker.describe(record.topic, record.partition), reason=UNDECODABLE_BATCH
            )
        return decode_request(record.value, self._limits)

    def _reply(self, topic: str, result: RankResult, record: ConsumerRecord[Any, Any]) -> _Outgoing:
        error = reasons.is_error_reply(result)
        self.metrics.observe_reply(
            degraded=result.degraded, reason=result.reason, error=error, topic=topic
        )
        if not error:
            self.metrics.observe_stages(result.timings_ms)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "reply to %s on %s: %s",
                result.request_id,
                topic,
                "error" if error else result.reason or "ok",
                extra={
                    **logs.request_fields(result.request_id, result.user_id, result.model_version),
                    **logs.record_fields(record.topic, record.partition, record.offset),
                    "reply_topic": topic,
                    "degraded": result.degraded,
                    "reason": result.reason,
                    "total_ms": result.timings_ms.get("total"),
                },
            )
        return _Outgoing(topic, result.request_id.encode(), result.to_json())

    def _reject(
        self, record: ConsumerRecord[Any, Any], exc: ContractError, at: int
    ) -> list[_Outgoing]:
        """A dead letter with the reason, and an error reply when the request_id is readable."""
        s = self.settings
        self.metrics.dead_letters.labels(exc.reason).inc()
        logger.info(
            "dead-lettering %s[%s]@%s: %s",
            record.topic,
            record.partition,
            record.offset,
            exc,
            extra={
                **logs.request_fields(
                    peek_request_id(record.value), peek_field(record.value, "user_id")
                ),
                **logs.record_fields(record.topic, record.partition, record.offset),
                "reason": exc.reason,
            },
        )
        letter = DeadLetter.rejected(record, exc, at=at)
        out = [_Outgoing(s.topics.dead_letters, record.key or b"", letter.to_json())]
        if exc.reason == UNDECODABLE_BATCH:
            return out  # no request in it can be read, so no one to answer
        request_id = peek_request_id(record.value, max_length=self._limits.max_id_length)
        if request_id is not None:
            result = replies.error_reply(
                request_id, "", reasons.INVALID_REQUEST, f"{exc.reason}: {exc}", now_ms=at
            )
            # The caller listens where it asked to be answered, when that topic is allowed.
            topic = replies.reply_topic(
                peek_field(record.value, "reply_to", max_length=self._limits.max_id_length),
                default=s.topics.results,
                allowed=s.topics.reply_allowed,
            )
            out.append(self._reply(topic or s.topics.results, result, record))
        return out

    async def _produce(
        self, outgoing: Sequence[_Outgoing], records: Sequence[ConsumerRecord[Any, Any]]
    ) -> bool:
        """Send everything and await the acknowledgements; on failure rewind the batch."""
        assert self._producer is not None and self._consumer is not None
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
            self._offsets.rewound()
            first = first_offsets(records)
            positions: dict[TopicPartition, int] = {}
            for tp in first:
                # revoked: its new owner resumes from the last commit, before these records
                with contextlib.suppress(IllegalStateError):
                    positions[tp] = await self._consumer.position(tp)
            for tp, offset in rewind_targets(first, positions).items():
                self._consumer.seek(tp, offset)
            await asyncio.sleep(0.5)
            return False

    async def _commit(self, records: Sequence[ConsumerRecord[Any, Any]]) -> None:
        """Mark a batch answered; commit what is answered when a commit is due."""
        self._offsets.answered(records)
        if self._offsets.due() and not self._holding_commits:
            await self.commit_answered()

    async def commit_answered(self) -> None:
        """Commit the offsets of every batch answered so far."""
        if self._consumer is None:
            return
        offsets = self._offsets.take()
        # Partitions that moved away since: their new owner answers from the last commit.
        assigned = self._consumer.assignment()
        offsets = {tp: offset for tp, offset in offsets.items() if tp in assigned}
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:
            # The replies are out; a rebalance means another member may answer these again,
            # which clients tolerate (duplicates are dropped).
            self.metrics.commits.labels("failed").inc()
            logger.warning("offset commit failed (%s); some requests may be answered twice", exc)
        else:
            self.metrics.commits.labels("ok").inc()
