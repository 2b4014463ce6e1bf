"""`streamrank lag` reads a group's committed offsets against the end offsets."""

from __future__ import annotations

from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from workbench.lag import group_lag, summarise


async def test_lag_is_end_offset_minus_committed(
    make_settings: Callable[..., Settings], unique: str
) -> None:
    settings = make_settings()
    topic = settings.topics.clicks
    await create_topics(settings, partitions=2, topics=(topic,))
    producer = AIOKafkaProducer(**settings.kafka.client_kwargs())
    await producer.start()
    try:
        for _ in range(7):
            await producer.send_and_wait(topic, b"x", partition=0)
        for _ in range(3):
            await producer.send_and_wait(topic, b"y", partition=1)
    finally:
        await producer.stop()
    group = f"g-{unique}"
    rows = await group_lag(settings, group, topic)
    assert [(r.partition, r.end_offset, r.committed, r.lag) for r in rows] == [
        (0, 7, None, 7),
        (1, 3, None, 3),
    ]
    consumer = AIOKafkaConsumer(
        **settings.kafka.client_kwargs(), group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(5, "")})
    finally:
        await consumer.stop()
    summary = summarise(await group_lag(settings, group, topic))
    assert summary["total_lag"] == 2 + 3
    assert summary["partitions"][0] == {
        "topic": topic,
        "partition": 0,
        "end_offset": 7,
        "committed": 5,
        "lag": 2,
        "owner": None,
        "host": None,
    }
