"""The scoring worker's Kafka clients, and how it fetches a micro-batch (shared with the echo
benchmark, which measures the same Kafka path without ranking)."""

from __future__ import annotations

import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord

from streamrank.kafka import clients as kafka
from streamrank.kafka.fetch_wait import FetchWait
from streamrank.settings import ScoringSettings, Settings


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


async def next_batch(fetch: FetchWait, scoring: ScoringSettings) -> list[ConsumerRecord[Any, Any]]:
    """Up to ``scoring.batch_max`` records: the first wait is open-ended (200 ms polls, the
    fetch wait kept from starving by ``fetch``), then more are gathered for at most
    ``scoring.batch_wait_ms``."""
    consumer = fetch.consumer
    got = await fetch.getmany(timeout_ms=200, max_records=scoring.batch_max)
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
