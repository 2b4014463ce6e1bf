"""The lifecycle every aiokafka consumer-group worker shares, and :func:`serve`, which runs one as
a process.

A worker (:class:`GroupWorker`) opens Redis and its own dependencies, starts its group
membership (readiness, registry entry, rebalance metrics), reaches Kafka, retrying with
back-off while the broker is unreachable (up to ``kafka_start_timeout_s``), then starts its
background tasks. ``stop`` undoes all of it in reverse. :func:`serve` adds the
``/metrics`` + ``/healthz`` + ``/readyz`` server and the signals: the first SIGTERM or SIGINT
lets a consuming worker finish what is in flight, commit and leave its group (a worker still
waiting for Kafka stops at once); a second one cancels.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, ClassVar, Self

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from streamrank.kafka import clients as kafka
from streamrank.runtime import groups
from streamrank.runtime.group_metrics import GroupMetrics, commit_offsets, report_lag
from streamrank.runtime.health import Check, Health
from streamrank.runtime.loop_health import (
    GcHook,
    GcPauses,
    freeze_start_up_objects,
    watch_loop_lag,
)
from streamrank.runtime.membership import Membership
from streamrank.runtime.metrics_http import metrics_server, resolve_port
from streamrank.runtime.rebalance import RebalanceListener
from streamrank.runtime.signals import run_until_signalled
from streamrank.runtime.tasks import cancel_and_wait
from streamrank.settings import Settings

logger = logging.getLogger(__name__)


class GroupWorker(abc.ABC):
    """``async with worker: await worker.run()``, or ``start`` / ``run`` / ``stop``;
    :meth:`request_stop` ends ``run`` after the work in flight.

    A subclass opens its own dependencies (:meth:`open`), makes its Kafka clients
    (:meth:`kafka_clients`), announces that it consumes (:meth:`announce`: the line
    ``workbench.devstack.processes`` waits for) and runs its loop (:meth:`run`)."""

    kind: ClassVar[str]  # "scoring", "outcomes": client ids, the default metrics port, logs

    def __init__(
        self,
        *,
        settings: Settings,
        metrics: GroupMetrics,
        health: Health,
        group: str,
        topics: Sequence[str],
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.health = health
        self.group = group
        self.topics = list(topics)
        self.client_id = groups.client_id(self.kind, settings.kafka.group_instance_id)
        self.membership = Membership(
            kind=self.kind, group=group, member=self.client_id, topics=self.topics,
            health_=health, metrics=metrics,
        )  # fmt: skip
        self.rebalance = RebalanceListener(membership=self.membership, finish=self.finish_inflight)
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._redis: Any = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._gc_pauses = GcPauses(metrics.gc_paused)

    # --- what a worker kind adds -----------------------------------------------------------

    def guard_gc_hook(self, hook: GcHook) -> GcHook:
        """The GC-pause hook as installed; a kind whose threads run traced code (a compiled
        forward) wraps it so that the tracer leaves it alone when a collection runs there."""
        return hook

    @abc.abstractmethod
    async def open(self) -> Any:
        """Open Redis (returned: readiness pings it) and the worker's own dependencies."""

    @abc.abstractmethod
    def kafka_clients(self) -> tuple[AIOKafkaProducer, AIOKafkaConsumer]:
        """The producer and the (not yet subscribed) group consumer."""

    @abc.abstractmethod
    def announce(self) -> None:
        """Log that the worker consumes."""

    @abc.abstractmethod
    async def run(self) -> None:
        """Consume until :meth:`request_stop` (or cancellation)."""

    def group_clients(self, *, max_poll_records: int) -> tuple[AIOKafkaProducer, AIOKafkaConsumer]:
        """An acknowledged producer and a manually committed group consumer from the earliest
        offset: the clients of a worker that commits after its effects."""
        s = self.settings
        producer = kafka.producer(s.kafka, acks="all", linger_ms=5)
        consumer = kafka.consumer(
            s.kafka,
            group_id=self.group,
            client_id=self.client_id,
            **kafka.group_kwargs(s.kafka),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=max_poll_records,
        )
        return producer, consumer

    def kafka_starters(
        self, producer: AIOKafkaProducer, consumer: AIOKafkaConsumer
    ) -> list[Callable[[], Awaitable[Any]]]:
        """What reaching Kafka takes, in order (each retried while the broker is away)."""
        return [producer.start, consumer.start]

    def checks(self) -> Mapping[str, Check]:
        """Readiness checks besides ``group`` and ``redis``."""
        return {}

    def background(self) -> dict[str, Coroutine[Any, Any, None]]:
        """Background tasks by name, started once Kafka is reached."""
        return {}

    async def finish_inflight(self) -> None:  # noqa: B027 (optional: nothing by default)
        """Before partitions move: finish the work in flight and commit it."""

    async def close(self) -> None:  # noqa: B027 (optional: nothing by default)
        """At stop, before the background tasks and the Kafka clients stop."""

    # --- what a batch's end takes --------------------------------------------------------------

    async def produce_dead_letters(self, letters: Sequence[tuple[bytes, bytes]]) -> None:
        """Dead letters ``(key, value)``, acknowledged; retried while the broker is away (the
        batch's effects are applied and idempotent, so waiting here loses nothing)."""
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
                if self.stopping:
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def commit_records(
        self, records: Sequence[ConsumerRecord[Any, Any]], *, if_failed: str
    ) -> None:
        """Commit past ``records`` (their effects are durable) and report the lag they leave;
        ``if_failed`` says what a failed commit means (logged with the failure)."""
        assert self._consumer is not None
        offsets: dict[TopicPartition, int] = {}
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
        await commit_offsets(self._consumer, offsets, metrics=self.metrics, if_failed=if_failed)
        report_lag(
            {tp: offset - 1 for tp, offset in offsets.items()},
            assigned=self._consumer.assignment(),
            highwater=self._consumer.highwater,
            on_lag=self.metrics.set_lag,
        )

    # --- the lifecycle ---------------------------------------------------------------------

    @property
    def consuming(self) -> bool:
        """Started (Kafka reached) and not stopped."""
        return self._consumer is not None and not self._stopping.is_set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def request_stop(self) -> None:
        self._stopping.set()

    async def start(self) -> None:
        self._redis = await self.open()
        self.membership.start(self._redis, checks=self.checks())
        producer, consumer = self.kafka_clients()
        self._producer = producer
        consumer.subscribe(self.topics, listener=self.rebalance)
        self.membership.joining()
        try:
            starters = self.kafka_starters(producer, consumer)
            await kafka.start_with_retry(self.settings.kafka, starters, what=f"{self.kind} worker")
        except BaseException:  # not reachable in time, or stopped while waiting
            self._consumer = consumer
            await self.stop()
            raise
        self._consumer = consumer
        tasks = {**self.background(), "loop-lag": watch_loop_lag(self.metrics.loop_lag.observe)}
        self._tasks = [asyncio.create_task(coro, name=name) for name, coro in tasks.items()]
        freeze_start_up_objects()  # the model, modules and clients: never garbage
        self._gc_pauses.install(self.guard_gc_hook)
        self.announce()

    async def stop(self) -> None:
        self._stopping.set()
        self._gc_pauses.remove()
        await self.close()
        # A cancellation that lands inside a Redis call can be lost (streamrank.runtime.tasks):
        # cancelled again until they end, and not waited for forever.
        await cancel_and_wait(self._tasks, what=f"{self.kind} worker", timeout_s=5)
        self._tasks = []
        for client in (self._consumer, self._producer):
            if client is not None:
                with contextlib.suppress(Exception):  # stopping: nothing left to lose
                    await client.stop()
        await self.membership.leave(what=f"{self.kind} worker")
        if self._redis is not None:
            await self._redis.aclose()
        self._consumer = self._producer = self._redis = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def serve(worker: GroupWorker, *, metrics_port: int | None) -> None:
    """Run ``worker`` in this process until it is stopped by a signal: ``/metrics``,
    ``/healthz`` and ``/readyz`` on ``metrics_port`` (else ``metrics_port`` of the settings,
    else the kind's default; 0 disables them)."""
    port = resolve_port(metrics_port, worker.settings.observability.metrics_port, worker.kind)

    def on_signal(task: asyncio.Task[Any]) -> None:
        # Consuming: finish the work in flight, commit, leave the group (nothing is processed
        # twice). Still starting (waiting for Kafka): nothing to finish, stop at once.
        if worker.consuming:
            worker.request_stop()
        else:
            task.cancel()

    run_until_signalled(_serve(worker, port), on_signal=on_signal)


async def _serve(worker: GroupWorker, port: int) -> None:
    with metrics_server(worker.metrics.registry, port, health=worker.health):
        async with worker:
            await worker.run()
