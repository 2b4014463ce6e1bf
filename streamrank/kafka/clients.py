"""Every Kafka client of ours is made here: one place sets the connection (TLS/SASL), the
producers' compression, the consumers' isolation level, and installs the undecodable-batch
guard (:mod:`streamrank.kafka.guard`) before a consumer fetches anything."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError

from streamrank.errors import KafkaUnavailable
from streamrank.kafka import guard as kafka_guard
from streamrank.settings import KafkaSettings

logger = logging.getLogger(__name__)


def producer_kwargs(kafka: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments of an ``AIOKafkaProducer`` of ours (connection + compression)."""
    kwargs = kafka.client_kwargs()
    if kafka.compression != "none":
        kwargs["compression_type"] = kafka.compression
    return kwargs


def consumer_kwargs(kafka: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments of an ``AIOKafkaConsumer`` of ours (connection + isolation level)."""
    kwargs = kafka.client_kwargs()
    kwargs["isolation_level"] = kafka.isolation_level
    return kwargs


def group_kwargs(kafka: KafkaSettings) -> dict[str, Any]:
    """Consumer-group membership options of a worker's consumer (session, heartbeats, static
    membership)."""
    return {
        "group_instance_id": kafka.group_instance_id,
        "session_timeout_ms": kafka.session_timeout_ms,
        "heartbeat_interval_ms": kafka.heartbeat_interval_ms,
    }


def producer(kafka: KafkaSettings, **options: Any) -> AIOKafkaProducer:
    """A producer of ours; ``options`` are aiokafka's (acks, linger_ms ...)."""
    return AIOKafkaProducer(**{**producer_kwargs(kafka), **options})


def consumer(kafka: KafkaSettings, *topics: str, **options: Any) -> AIOKafkaConsumer:
    """A consumer of ours, guarded against undecodable batches; ``options`` are aiokafka's."""
    kafka_guard.install()
    return AIOKafkaConsumer(*topics, **{**consumer_kwargs(kafka), **options})


async def start_with_retry(
    kafka: KafkaSettings,
    starters: Sequence[Callable[[], Awaitable[Any]]],
    *,
    what: str,
    max_delay_s: float = 5.0,
) -> None:
    """Run each of ``starters`` (``client.start`` ...) in order, retrying the one that fails
    while the broker is unreachable: back-off from 0.5 s to ``max_delay_s``, one warning when
    it starts failing, one line when it answers, and :class:`KafkaUnavailable` once
    ``kafka.start_timeout_s`` has passed (an aiokafka client whose start failed can be
    started again)."""
    limit_s = kafka.start_timeout_s
    began = time.monotonic()
    delay = 0.5
    failing = False
    for start in starters:
        while True:
            try:
                await start()
                break
            except KafkaError as exc:
                waited = time.monotonic() - began
                if waited + delay > limit_s:
                    raise KafkaUnavailable(
                        f"{what}: Kafka at {kafka.bootstrap} did not answer within "
                        f"{limit_s:.0f}s ({exc}); is the broker up and "
                        "STREAMRANK_KAFKA_BOOTSTRAP right? (STREAMRANK_KAFKA_START_TIMEOUT_S "
                        "sets how long to wait)"
                    ) from exc
                if not failing:
                    logger.warning(
                        "%s: Kafka at %s is unreachable (%s); retrying with back-off for up to "
                        "%.0fs (STREAMRANK_KAFKA_START_TIMEOUT_S)",
                        what,
                        kafka.bootstrap,
                        exc,
                        limit_s,
                    )
                    failing = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, max_delay_s)
    if failing:
        logger.info(
            "%s: Kafka at %s answered after %.1fs",
            what,
            kafka.bootstrap,
            time.monotonic() - began,
        )


async def wait_for_broker(kafka: KafkaSettings, *, what: str) -> None:
    """Until the cluster answers a bootstrap (metadata) request, as :func:`start_with_retry`."""
    client = AIOKafkaClient(**kafka.client_kwargs())
    try:
        await start_with_retry(kafka, [client.bootstrap], what=what)
    finally:
        await client.close()


async def end_offsets(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], *, timeout_s: float = 5.0
) -> dict[TopicPartition, int]:
    """The next offset to be written of each partition (the high watermark), for a consumer
    without a group; the partitions end up assigned to it.

    ListOffsets alone is not enough: the embedded Tansu broker answers it with the last
    batch's base offset + 1 (short by the batch's other records), while its fetch responses
    carry the right high watermark. So one fetch from just before the reported end, and the
    larger of the two (they agree on Apache Kafka)."""
    if not tps:
        return {}
    reported = await consumer.end_offsets(tps)
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, max(0, reported[tp] - 1))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(consumer.highwater(tp) is None for tp in tps):
        await consumer.getmany(*tps, timeout_ms=100)
    return {tp: max(reported[tp], consumer.highwater(tp) or 0) for tp in tps}
