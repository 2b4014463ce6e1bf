"""The README's round trip with standard Kafka tools: a RankRequest produced and its reply read
by librdkafka (confluent-kafka), an independent client, as `kcat` does against a real Kafka
(Debian's kcat cannot talk to the embedded broker)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition

from schemas import decode_result
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from tests.integration.support.kafka import in_thread
from tests.integration.support.scoring import item_ids, publish, running_worker

pytestmark = pytest.mark.timeout(180)


def kcat_produce(bootstrap: str, topic: str, key: str, value: str) -> None:
    """`echo 'KEY|VALUE' | kcat -P -b BOOTSTRAP -t TOPIC -K '|'`"""
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value.encode(), key=key.encode())
    assert producer.flush(30) == 0


def kcat_find(bootstrap: str, topic: str, key: str, timeout_s: float = 60) -> bytes:
    """`kcat -C -b BOOTSTRAP -t TOPIC -o beginning -f '%k %s\\n' | grep '^KEY '`"""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "kcat", "enable.auto.commit": False}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([CTopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None and message.key() == key.encode():
                return bytes(message.value())
        raise AssertionError(f"no message keyed {key!r} on {topic}")
    finally:
        consumer.close()


async def test_a_rank_request_round_trip_with_librdkafka(
    make_settings: Callable[..., Settings], unique: str, tiny_artifacts: tuple[Path, Path]
) -> None:
    settings = make_settings(
        STREAMRANK_SCORING_GROUP_ID=f"kcat-{unique}", STREAMRANK_SCORING_BUDGET_MS=10_000
    )
    await create_topics(settings)
    redis = redis_client(settings.redis)
    try:
        version = await publish(redis, tiny_artifacts[0])
    finally:
        await redis.aclose()
    items = item_ids(tiny_artifacts[0])[:3]
    request_id = f"r-{unique}"
    request = orjson.dumps({"request_id": request_id, "user_id": "u42", "items": items}).decode()
    pinned = settings.with_env(STREAMRANK_CANARY_SPLIT=f"{version}:1")
    async with running_worker(pinned):
        await in_thread(
            kcat_produce, settings.kafka.bootstrap, settings.topics.requests, "u42", request
        )
        raw = await in_thread(
            kcat_find, settings.kafka.bootstrap, settings.topics.results, request_id
        )
    reply = decode_result(raw)
    assert reply.request_id == request_id and reply.user_id == "u42"
    assert reply.items == tuple(items) and len(reply.scores) == 3
    assert reply.model_version == version and not reply.degraded
