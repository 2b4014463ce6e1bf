"""The Faust app of the features worker.

Faust owns the consumer group (membership, partition assignment, rebalances) and the offset
commits; state lives in Redis, so the app has no tables, no changelogs, no leader topic and no
web server. Two ways to hand records to the batch processor (setting ``features_path``):

- ``batch`` (default): ``FeaturesConsumer`` replaces Faust's per-message drain loop (which
  awaits ``wait_first(callback(message), ...)`` per message, then the conductor builds an Event
  and queues it for the agent's stream) with one that takes each fetch from Faust's consumer as
  a whole, processes it, and then acks every message of it through Faust's own
  ``Consumer.ack``, so Faust's commit task commits those offsets: after the Redis write. Up to
  ``features_max_inflight_batches`` batches are in flight (batches commute).
- ``agent``: a Faust agent with ``stream.take_events(n, within)``. The agent holds an extra
  reference on each message while the batch is processed and acks only after ``process``
  returned, so take_events' own ack (which also runs when the generator is closed by a
  shutdown or an error) can never make an unwritten offset committable. Costs more CPU per
  event in Faust's per-message machinery; kept for comparison (docs/streams.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from streamrank.kafka import guard as kafka_guard
from streamrank.kafka.fetch_wait import FetchWait, set_fetch_wait
from streamrank.runtime import group_metrics, groups
from streamrank.settings import KafkaSettings, Settings
from streams.classify import Record

logger = logging.getLogger(__name__)

BatchHandler = Callable[[Sequence[Record]], Awaitable[Any]]
LagHandler = group_metrics.LagHandler
CommitHandler = Callable[[bool], None]  # whether an offset commit succeeded


def report_lag(
    messages: Sequence[Any], *, assigned: Any, highwater: Callable[[Any], int | None],
    on_lag: LagHandler,
) -> None:  # fmt: skip
    """Records behind each partition's high watermark once ``messages`` are durable (a gauge
    for ops), for the partitions still assigned
    (:func:`streamrank.runtime.group_metrics.report_lag`)."""
    last = {m.tp: m.offset for m in messages}  # the last offset per partition
    group_metrics.report_lag(last, assigned=assigned, highwater=highwater, on_lag=on_lag)


def mark_processing(monitor: Any, messages: Sequence[Any], *, now: float) -> None:
    """Tell Faust's monitor (its public ``stream_inbound_time``, the time a stream last took a
    record of each partition) that these partitions' records are being processed: the batch
    path bypasses Faust's streams, and Faust's event-path check would otherwise log "Stream has
    not started processing" for every partition with lag, as if the worker were stuck."""
    if monitor is None:
        return
    for tp in {m.tp for m in messages}:
        monitor.stream_inbound_time[tp] = now


class FeaturesConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer thread with a short broker fetch wait (Faust hard-codes 1500 ms), raised
    while the broker starves it (:class:`~streamrank.kafka.fetch_wait.FetchWait`), and our
    isolation level (Faust reads uncommitted unless the app itself is transactional)."""

    _fetch_wait: FetchWait | None = None

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        floor_ms: int = self.app.fetch_max_wait_ms  # type: ignore[attr-defined]
        set_fetch_wait(consumer, floor_ms)
        consumer._isolation_level = self.app.isolation_level  # type: ignore[attr-defined]
        on_change = self.app.on_fetch_wait  # type: ignore[attr-defined]
        self._fetch_wait = FetchWait(consumer, floor_ms=floor_ms, on_change=on_change)
        logger.info(
            "features consumer: isolation_level %s, fetch_max_wait_ms %s",
            consumer._isolation_level,
            floor_ms,
        )
        return consumer

    async def _fetch_records(
        self,
        consumer: Any,
        active_partitions: Any,
        timeout: float | None = None,  # noqa: ASYNC109 (Faust's signature)
        max_records: int | None = None,
    ) -> Any:
        fetch_wait = self._fetch_wait
        parent = super()._fetch_records
        if fetch_wait is None or fetch_wait.consumer is not consumer:
            return await parent(consumer, active_partitions, timeout, max_records)

        async def fetch(probe_ms: int) -> Any:
            if not self.consumer.flow_active:  # rebalancing: Faust answers empty at once
                await asyncio.sleep(probe_ms / 1000)
                return {}
            return await parent(consumer, active_partitions, probe_ms / 1000, max_records)

        return await fetch_wait.read(fetch, timeout_ms=int(1000 * (timeout or 0)))


class FeaturesConsumer(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer; on the ``batch`` path it drains whole fetches into the app's
    batch handler instead of feeding the conductor message by message."""

    def _new_consumer_thread(self) -> Any:
        return FeaturesConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _commit(self, offsets: Any) -> bool:
        # Faust reports a commit's result only here (its sensors see attempts, not outcomes).
        ok = bool(await super()._commit(offsets))
        on_commit: CommitHandler | None = self.app.on_commit  # type: ignore[attr-defined]
        if on_commit is not None:
            on_commit(ok)
        return ok

    async def _drain_messages(self, fetcher: Any) -> None:
        if not self.app.use_batch_path:  # type: ignore[attr-defined]
            await super()._drain_messages(fetcher)
            return
        handler: BatchHandler = self.app.batch_handler  # type: ignore[attr-defined]
        max_inflight: int = self.app.max_inflight  # type: ignore[attr-defined]
        consumer_stopped = self._stopped.is_set
        fetcher_stopped = fetcher._stopped.is_set
        read_offset = self._read_offset
        ack = self.ack
        on_lag: LagHandler | None = self.app.on_lag  # type: ignore[attr-defined]
        # Batches commute (see docs/streams.md), so the next fetch is decoded while Redis runs
        # the previous batch's script; each batch is acked only after its own write.
        inflight: deque[tuple[asyncio.Future[Any], list[Any]]] = deque()

        async def finish_oldest() -> None:
            future, done_messages = inflight[0]
            await future
            inflight.popleft()
            for message in done_messages:
                ack(message)
            if on_lag is not None:
                report_lag(
                    done_messages, assigned=self.assignment(), highwater=self.highwater,
                    on_lag=on_lag,
                )  # fmt: skip

        try:
            while not (consumer_stopped() or fetcher_stopped()):
                messages = [message async for _tp, message in self.getmany(timeout=1.0)]
                if not messages:
                    while inflight:
                        await finish_oldest()
                    await asyncio.sleep(0)
                    continue
                for message in messages:
                    tp = message.tp
                    last = read_offset[tp]
                    # Offsets the broker skipped (transaction markers, compaction): acked.
                    if last is not None and message.offset > last + 1:
                        await self._add_gap(tp, last + 1, message.offset - 1)
                    read_offset[tp] = message.offset
                records = [_record(m) for m in messages]
                mark_processing(self.app.monitor, messages, now=time.monotonic())
                inflight.append((asyncio.ensure_future(handler(records)), messages))
                while inflight and (len(inflight) >= max_inflight or inflight[0][0].done()):
                    await finish_oldest()
        finally:
            # Stopping or crashing: unfinished batches are not acked, so they are replayed.
            for future, _messages in inflight:
                future.cancel()


class FeaturesTransport(faust_aiokafka.Transport):
    Consumer = FeaturesConsumer


class FeaturesApp(faust.App):
    """A Faust app with the features consumer (see the module doc)."""

    batch_handler: BatchHandler
    on_lag: LagHandler | None = None
    on_commit: CommitHandler | None = None
    on_fetch_wait: Callable[[int], None] | None = None  # the consumer's fetch wait in ms
    use_batch_path: bool = True
    fetch_max_wait_ms: int = 10
    isolation_level: str = "read_committed"
    max_inflight: int = 2

    def _new_transport(self) -> Any:
        return FeaturesTransport(self.conf.broker_consumer, self)


def _record(message: Any) -> Record:
    return Record(
        message.topic,
        message.partition,
        message.offset,
        message.key,
        message.value,
        message.timestamp,
        message.headers or (),
    )


def _credentials(kafka: KafkaSettings) -> Any:
    kwargs = kafka.client_kwargs()
    if kafka.sasl_mechanism:
        return faust.SASLCredentials(
            username=kwargs["sasl_plain_username"],
            password=kwargs["sasl_plain_password"],
            ssl_context=kwargs.get("ssl_context"),
            mechanism=kafka.sasl_mechanism,
        )
    if "ssl_context" in kwargs:
        return faust.SSLCredentials(kwargs["ssl_context"])
    return None


def create_app(settings: Settings, *, handler: BatchHandler) -> FeaturesApp:
    """The features app; ``handler`` applies one batch and returns once it is durable."""
    brokers = [f"kafka://{host.strip()}" for host in settings.kafka.bootstrap.split(",")]
    datadir = Path(settings.tools.run_dir) / "faust"
    # Faust needs its data directory to exist (a fresh checkout has no run dir yet).
    datadir.mkdir(parents=True, exist_ok=True)
    app = FeaturesApp(
        settings.features.app_id,
        broker=brokers,
        broker_credentials=_credentials(settings.kafka),
        autodiscover=False,
        datadir=str(datadir),
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        broker_client_id=groups.client_id("features", settings.kafka.group_instance_id),
        topic_disable_leader=True,
        topic_partitions=settings.topics.partitions,
        topic_replication_factor=settings.topics.replication,
        store="memory://",
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        # A dead worker's partitions move after the session timeout; heartbeats well inside it.
        broker_session_timeout=settings.kafka.session_timeout_ms / 1000,
        broker_heartbeat_interval=settings.kafka.heartbeat_interval_ms / 1000,
        consumer_group_instance_id=settings.kafka.group_instance_id,
        # members get this long to rejoin a rebalance: at least the session timeout (Faust's
        # 10 s default is shorter than a static-membership session, and the embedded broker
        # pads each join by a share of it), else a busy member misses the rejoin and the group
        # rebalances again
        broker_rebalance_timeout=max(10.0, settings.kafka.session_timeout_ms / 1000),
        broker_request_timeout=30.0,
        broker_commit_interval=settings.features.commit_interval_s,
        broker_commit_every=10 * settings.features.batch_size,
        broker_max_poll_records=settings.features.batch_size,
        broker_max_poll_interval=300.0,
        consumer_max_fetch_size=4 * 1024 * 1024,
        stream_buffer_maxsize=4 * settings.features.batch_size,
        stream_wait_empty=False,
        producer_acks=-1,
    )
    app.batch_handler = handler
    app.use_batch_path = settings.features.path == "batch"
    app.fetch_max_wait_ms = settings.features.fetch_max_wait_ms
    app.isolation_level = settings.kafka.isolation_level
    kafka_guard.install()  # an undecodable batch becomes one dead letter, not a crash
    app.max_inflight = settings.features.max_inflight_batches
    # Clicks and item events share one consumer (the processor splits a batch by topic).
    topic = app.topic(
        settings.topics.clicks, settings.topics.items, key_type=bytes, value_type=bytes, acks=True
    )
    if settings.features.path == "batch":
        # Subscribe without an agent: FeaturesConsumer hands whole fetches to the handler.
        app.topics.add(topic)
    else:
        batch_size, within = settings.features.batch_size, settings.features.batch_within_s

        @app.agent(topic, name="features")
        async def features(stream: Any) -> None:
            async for events in stream.take_events(batch_size, within):
                # take_events acks the batch when it is closed too (shutdown, error): hold one
                # more reference per message so that only our ack below, after the batch is
                # durable, can bring it to zero and make the offset committable.
                for event in events:
                    event.message.incref()
                await handler([_record(event.message) for event in events])
                for event in events:
                    event.ack()

    return app
