"""Every Kafka client of ours is made here: one place sets the connection (TLS/SASL), the
producers' compression, the consumers' isolation level, and installs the undecodable-batch
guard (:mod:`streamrank.kafka_guard`) before a consumer fetches anything."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streamrank import kafka_guard
from streamrank.settings import Settings


def producer_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of an ``AIOKafkaProducer`` of ours (connection + compression)."""
    kwargs = settings.kafka_client_kwargs()
    if settings.kafka_compression != "none":
        kwargs["compression_type"] = settings.kafka_compression
    return kwargs


def consumer_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of an ``AIOKafkaConsumer`` of ours (connection + isolation level)."""
    kwargs = settings.kafka_client_kwargs()
    kwargs["isolation_level"] = settings.kafka_isolation_level
    return kwargs


def group_kwargs(settings: Settings) -> dict[str, Any]:
    """Consumer-group membership options of a worker's consumer (session, heartbeats, static
    membership)."""
    return {
        "group_instance_id": settings.kafka_group_instance_id,
        "session_timeout_ms": settings.kafka_session_timeout_ms,
        "heartbeat_interval_ms": settings.kafka_heartbeat_interval_ms,
    }


def producer(settings: Settings, **options: Any) -> AIOKafkaProducer:
    """A producer of ours; ``options`` are aiokafka's (acks, linger_ms ...)."""
    return AIOKafkaProducer(**{**producer_kwargs(settings), **options})


def consumer(settings: Settings, *topics: str, **options: Any) -> AIOKafkaConsumer:
    """A consumer of ours, guarded against undecodable batches; ``options`` are aiokafka's."""
    kafka_guard.install()
    return AIOKafkaConsumer(*topics, **{**consumer_kwargs(settings), **options})
