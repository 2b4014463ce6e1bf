"""ItemEvents through the features worker process: the newest event of each item lands in the
item attribute table, an older one never overwrites it, a bad one is dead-lettered."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from schemas import ItemEvent
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streams.attributes import read_item_attributes
from tests.integration.support.features import poll, read_dead_letters
from workbench.cli.items import publish_items
from workbench.devstack.processes import start_worker
from workbench.devstack.services import free_port

pytestmark = [pytest.mark.timeout(120), pytest.mark.cluster]


async def test_item_events_land_in_the_attribute_table_newest_first(
    make_settings, unique, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(
        STREAMRANK_FEATURES_APP_ID=f"features-{unique}", STREAMRANK_METRICS_PORT=free_port()
    )
    await create_topics(settings)
    now = int(time.time() * 1000)
    a, b = f"a-{unique}", f"b-{unique}"
    newer = ItemEvent(a, "Drama", now, {"genres": ("Drama", "War")})
    older = ItemEvent(a, "Comedy", now - 1000)  # produced after the newer one
    await publish_items(settings, [newer, older, ItemEvent(b, None, now, {"genres": ("Action",)})])
    worker = start_worker("features", settings, log_path=tmp_path / "worker.log", metrics_port=None)
    client = redis_client(settings.redis)
    try:
        await asyncio.to_thread(worker.wait_ready, 60)
        await poll(
            lambda: _both(client, a, b), timeout_s=30, what="both items in the attribute table"
        )
        # a replay of the newer event rewrites the same value; the older one again changes nothing
        await publish_items(settings, [older, newer])
        producer = AIOKafkaProducer(**settings.kafka.client_kwargs())
        await producer.start()
        await producer.send_and_wait(settings.topics.items, b'{"item_id": 5, "ts": 1}', key=b"x")
        await producer.stop()
        [letter] = await read_dead_letters(settings, expected=1)
        values = await read_item_attributes(client, [a, b, f"c-{unique}"])
    finally:
        await client.aclose()
        worker.stop()
    assert values == {
        a: {"category": "Drama", "attributes": {"genres": ["Drama", "War"]}, "ts": now},
        b: {"category": None, "attributes": {"genres": ["Action"]}, "ts": now},
    }
    assert letter.source_topic == settings.topics.items and letter.reason == "bad_type"
    assert orjson.loads(letter.original_bytes())["item_id"] == 5


async def _both(client, a: str, b: str) -> bool:  # type: ignore[no-untyped-def]
    return len(await read_item_attributes(client, [a, b])) == 2
