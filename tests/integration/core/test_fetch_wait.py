"""A fetch wait too short for the broker starves a plain consumer; FetchWait raises it until
the records come. On the embedded broker (Tansu) a fetch held 0 ms is answered empty however
many records wait: the same starvation a busy broker holding many records shows at 2 ms."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streamrank.kafka.fetch_wait import FetchWait
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings

RECORDS = 300


async def read_for(read: Callable[[], Any], seconds: float) -> int:
    got, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        got += sum(len(records) for records in (await read()).values())
    return got


async def test_a_starving_consumer_gets_its_wait_raised_and_reads_everything(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    topic = settings.topics.requests
    await create_topics(settings, partitions=1, topics=(topic,))
    producer = AIOKafkaProducer(**settings.kafka.client_kwargs())
    await producer.start()
    try:
        for n in range(RECORDS):
            await producer.send(topic, b"r%d" % n, partition=0)
        await producer.flush()
    finally:
        await producer.stop()
    tp = TopicPartition(topic, 0)
    plain = AIOKafkaConsumer(**settings.kafka.client_kwargs(), fetch_max_wait_ms=0)
    adaptive = AIOKafkaConsumer(**settings.kafka.client_kwargs(), fetch_max_wait_ms=0)
    changes: list[int] = []
    for consumer in (plain, adaptive):
        await consumer.start()
        consumer.assign([tp])
        consumer.seek(tp, 0)
    try:
        fetch = FetchWait(adaptive, floor_ms=0, on_change=changes.append)
        starved = await read_for(lambda: plain.getmany(timeout_ms=200), 1.5)
        read = await read_for(lambda: fetch.getmany(timeout_ms=200), 3.0)
    finally:
        for consumer in (plain, adaptive):
            await consumer.stop()
    assert starved < RECORDS  # the broker's behaviour this test stands on
    assert read == RECORDS
    assert changes[0] == 0 and changes[-1] == fetch.wait_ms > 0  # the gauge follows the wait
    assert adaptive._fetch_max_wait_ms == fetch.wait_ms  # what the next fetch request asks for
