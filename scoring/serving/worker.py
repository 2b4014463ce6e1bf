"""``streamrank worker scoring``: the Kafka shell around :class:`scoring.serving.service.RankService`.

A consumer group on ``rank-requests`` (aiokafka: it gives direct control of micro-batching
and of when offsets are committed), on the shared worker lifecycle
(:mod:`streamrank.runtime.worker`). Per micro-batch: decode (:mod:`.triage`: bad input -> dead
letters plus an error reply when the request_id can be read), rank, build the replies
(:mod:`.outgoing`), produce them, await the broker's acknowledgements, then commit
(:mod:`.checkpoint`). If producing fails, the consumer seeks back to the batch start, so a
request is answered at least once (clients drop duplicate replies).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from prometheus_client import CollectorRegistry

from schemas import Limits
from scoring.model.runtimes import untraced
from scoring.serving.checkpoint import Checkpoint
from scoring.serving.hotpool import HotPool
from scoring.serving.kafka_clients import next_batch, reply_producer, request_consumer
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.outgoing import ReplyWriter
from scoring.serving.protocols import EmbeddingSource, FeatureSource, HotItems
from scoring.serving.service import RankService
from scoring.serving.triage import Routing, Triage
from scoring.serving.watcher import Loader, RetrieverLoader, VersionWatcher
from scoring.serving.wiring import (
    Dependencies,
    configure_torch,
    hot_pool,
    rank_service,
    scoring_redis,
)
from streamrank import clock
from streamrank.kafka.fetch_wait import FetchWait
from streamrank.runtime.health import Check, Health
from streamrank.runtime.loop_health import GcHook
from streamrank.runtime.worker import GroupWorker
from streamrank.runtime.worker import serve as serve_worker
from streamrank.settings import Settings

logger = logging.getLogger(__name__)

READY = "scoring worker consuming"  # workbench.devstack.processes waits for it
READY_CHECKS = ("group", "model", "redis")  # what /readyz waits for


class ScoringWorker(GroupWorker):
    """Consume rank requests, reply with scores; ``async with`` or ``start``/``run``/``stop``."""

    kind = "scoring"
    metrics: ScoringMetrics

    def __init__(
        self,
        *,
        settings: Settings,
        registry: CollectorRegistry | None = None,
        features: FeatureSource | None = None,
        embeddings: EmbeddingSource | None = None,
        loader: Loader | None = None,
        health: Health | None = None,
        retrievers: RetrieverLoader | None = None,
        hot: HotItems | None = None,
    ) -> None:
        metrics = ScoringMetrics(registry)
        super().__init__(
            settings=settings,
            metrics=metrics,
            health=health if health is not None else Health(READY_CHECKS),
            group=settings.scoring.group_id,
            topics=[settings.topics.requests],
        )
        self._injected = Dependencies(features, embeddings, loader, retrievers, hot)
        self._writer = ReplyWriter(metrics=metrics, served_log_topic=settings.topics.served_log)
        self._triage = Triage(
            routing=Routing.from_settings(settings),
            limits=Limits.from_settings(settings.limits),
            metrics=metrics,
            writer=self._writer,
        )
        self.watcher: VersionWatcher | None = None
        self.service: RankService | None = None
        self.hot_pool: HotPool | None = None
        self._checkpoint: Checkpoint | None = None
        self._fetch: FetchWait | None = None
        self._inflight: collections.deque[asyncio.Task[bool]] = collections.deque()
        self.batches = 0

    @property
    def rewinds(self) -> int:
        """How many times a failed batch rewound the consumer (a batch fetched before the
        latest rewind does not commit)."""
        return self._checkpoint.rewinds if self._checkpoint is not None else 0

    # --- the lifecycle's parts (streamrank.runtime.worker) ---------------------------------

    def guard_gc_hook(self, hook: GcHook) -> GcHook:
        return untraced(hook)  # collections run inside the compiled forward's thread too

    async def open(self) -> Any:
        configure_torch(self.settings.scoring)
        redis = scoring_redis(self.settings)
        self.hot_pool = hot_pool(self.settings, redis, self.metrics)
        self.watcher, self.service = rank_service(
            self.settings, redis, self.metrics, self._injected, hot=self.hot_pool
        )
        try:
            await self.watcher.refresh()
        except Exception as exc:  # Redis down at start: serve degraded until it answers
            logger.warning("could not read the model pointer at start (%s); will retry", exc)
        self.watcher.start()
        await self.hot_pool.refresh()  # a failure is logged; the background refresh retries
        self.hot_pool.start()
        return redis

    def checks(self) -> Mapping[str, Check]:
        return {"model": self._model_check}

    def _model_check(self) -> tuple[bool, str]:
        serving = self.watcher.describe() if self.watcher is not None else "nothing"
        return serving != "nothing", f"serving {serving}"

    def kafka_clients(self) -> tuple[AIOKafkaProducer, AIOKafkaConsumer]:
        s = self.settings
        producer = reply_producer(s)
        consumer = request_consumer(s, group_id=self.group, client_id=self.client_id)
        self._fetch = FetchWait(
            consumer,
            floor_ms=s.scoring.fetch_wait_ms,
            on_change=lambda ms: self.metrics.fetch_wait.set(ms / 1000),
        )
        self._checkpoint = Checkpoint(
            consumer=consumer,
            producer=producer,
            metrics=self.metrics,
            commit_interval_s=s.scoring.commit_interval_ms / 1000,
        )
        return producer, consumer

    def announce(self) -> None:
        s = self.settings
        assert self._consumer is not None and self.watcher is not None
        logger.info(
            "%s %s as group %s (isolation_level %s, replies compressed with %s); serving %s",
            READY,
            s.topics.requests,
            self.group,
            self._consumer._isolation_level,
            s.kafka.compression,
            self.watcher.describe(),
        )

    async def close(self) -> None:
        if self.watcher is not None:
            await self.watcher.stop()
        if self.service is not None:
            await self.service.cascade.cache.drain()  # results written for the group
        if self.hot_pool is not None:
            await self.hot_pool.stop()
        with contextlib.suppress(Exception):  # what was answered is not asked again
            await self.commit_answered()

    # --- the loop ---------------------------------------------------------------------------

    async def _next_batch(self) -> list[ConsumerRecord[Any, Any]]:
        assert self._fetch is not None
        return await next_batch(self._fetch, self.settings.scoring)

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
            while not self.stopping:
                while inflight and inflight[0].done():
                    inflight.popleft().result()
                if len(inflight) >= self.settings.scoring.pipeline_depth:
                    await asyncio.wait({inflight[0]})
                    continue
                rewinds = self.rewinds
                records = await self._next_batch()
                if records:
                    previous = inflight[-1] if inflight else None
                    inflight.append(
                        asyncio.create_task(self.process(records, after=previous, rewinds=rewinds))
                    )
                elif not inflight and self._checkpoint is not None and self._checkpoint.pending:
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
        if self._checkpoint is None:
            return
        with self._checkpoint.held():
            try:
                pending = [t for t in self._inflight if not t.done()]
                if pending:
                    _done, late = await asyncio.wait(pending, timeout=timeout_s)
                    if late:
                        logger.warning(
                            "%d batches still in flight after %.0fs at a rebalance; their "
                            "requests may be answered twice",
                            len(late),
                            timeout_s,
                        )
                await self.commit_answered()
            except Exception:
                logger.exception(
                    "committing before a rebalance failed; some requests may be answered twice"
                )

    async def process(
        self,
        records: Sequence[ConsumerRecord[Any, Any]],
        *,
        after: asyncio.Task[bool] | None = None,
        rewinds: int | None = None,
    ) -> bool:
        """Answer one batch of records, then (once ``after``, the batch before, committed)
        commit their offsets. False when the batch was rewound to be answered again."""
        assert self.service is not None and self._checkpoint is not None
        checkpoint = self._checkpoint
        fetched_at = checkpoint.rewinds if rewinds is None else rewinds
        triaged = self._triage.batch(records, received=clock.now_ms())
        ranked = (
            await self.service.rank(triaged.valid, deadlines=triaged.deadlines)
            if triaged.valid
            else []
        )
        outgoing = triaged.outgoing + self._writer.ranked(triaged.topics, triaged.records, ranked)
        produced = await checkpoint.produce(outgoing, records)
        if after is not None:
            await after  # offsets are committed in order
        if not produced or checkpoint.rewinds != fetched_at:
            # Rewound since these were fetched: they come again. A batch fetched after the
            # rewind commits normally (keying on the batch before's result stopped every
            # later commit after one failed produce).
            return False
        acked = clock.now_ms()
        for incoming in triaged.valid:
            self.metrics.latency.observe(max(0.0, acked - incoming.produced_ms) / 1000.0)
        self.metrics.batch_size.observe(len(records))
        await checkpoint.answered(records)
        checkpoint.observe_lag(records)
        self.batches += 1
        return True

    async def commit_answered(self) -> None:
        """Commit the offsets of every batch answered so far."""
        if self._checkpoint is not None and self._consumer is not None:
            await self._checkpoint.commit()


def serve(settings: Settings, *, metrics_port: int | None = None) -> None:
    """Run one scoring worker in this process until a signal stops it (its metrics and health
    endpoints on ``metrics_port``)."""
    serve_worker(
        ScoringWorker(settings=settings, registry=CollectorRegistry()), metrics_port=metrics_port
    )
