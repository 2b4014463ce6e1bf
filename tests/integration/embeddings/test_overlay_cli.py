"""`streamrank embeddings upsert` from files (JSON lines, .npy + ids) and from a topic (the
overlay worker: rows upserted, bad rows dead-lettered with their reason, offsets committed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry

from schemas import decode_dead_letter
from scoring.embeddings.codec import roundtrip
from scoring.embeddings.overlay_worker import OverlayWorker
from scoring.embeddings.store import EmbeddingStore
from scoring.model.registry import delete_version
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from tests.conftest import StackInfo
from tests.integration.support.embeddings import matrix
from tests.integration.support.scoring import read_topic, wait_for
from workbench.cli.main import main

DIM = 4


async def _publish(url: str, version: str) -> None:
    async with EmbeddingStore.from_url(url) as store:
        ids = [f"i{k}" for k in range(50)]
        await store.publish(
            "item", ids, matrix(50, DIM, 1), encoding="fp32", version=version, progress=False
        )


async def _rows(url: str, version: str, ids: list[str]) -> Any:
    async with EmbeddingStore.from_url(url) as store:
        return await store.fetch_encoded("item", ids, version=version)


async def _delete(url: str, version: str) -> None:
    async with EmbeddingStore.from_url(url) as store:
        await delete_version(store, version, force=True)


def test_upsert_from_files_and_info(
    stack: StackInfo,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("STREAMRANK_REDIS_URL", stack.redis_url)
    version = f"ovcli-{unique}"
    asyncio.run(_publish(stack.redis_url, version))
    try:
        jsonl = tmp_path / "rows.jsonl"
        jsonl.write_text(
            '{"id": "i1", "vector": [1, 2, 3, 4]}\n{"id": "new", "vector": [0, 0, 0, 1]}\n'
        )
        assert (
            main(["embeddings", "upsert", "--version", version, "--file", str(jsonl), "--json"])
            == 0
        )
        out = orjson.loads(capsys.readouterr().out)
        assert (out["rows"], out["new_rows"], out["overlay_rows"]) == (2, 2, 2)
        npy, ids = tmp_path / "rows.npy", tmp_path / "ids.txt"
        np.save(npy, np.array([[5.0, 6.0, 7.0, 8.0]], dtype=np.float32))
        ids.write_text("i2\n")
        argv = ["embeddings", "upsert", "--version", version, "--file", str(npy), "--ids", str(ids)]
        assert main(argv) == 0
        assert "overlay id 000000000002, 3 overlay rows" in capsys.readouterr().out
        rows = asyncio.run(_rows(stack.redis_url, version, ["i1", "new", "i2", "i3"]))
        assert rows.found.tolist() == [True, True, True, True]
        assert rows.decode()[:3].tolist() == [[1, 2, 3, 4], [0, 0, 0, 1], [5, 6, 7, 8]]

        assert main(["embeddings", "info", version, "--json"]) == 0
        (info,) = orjson.loads(capsys.readouterr().out)
        assert (info["overlay_id"], info["overlay_rows"], info["rows"]) == ("000000000002", 3, 50)

        jsonl.write_text('{"id": "i1", "vector": [1, 2, 3]}\n')  # the table's dim is 4
        assert main(["embeddings", "upsert", "--version", version, "--file", str(jsonl)]) == 1
        err = capsys.readouterr().err
        assert "line 1: bad_dim" in err and "nothing written" in err
        assert main(["embeddings", "upsert", "--version", version, "--file", str(npy)]) == 1
        assert "--ids" in capsys.readouterr().err
    finally:
        asyncio.run(_delete(stack.redis_url, version))


async def test_topic_mode_upserts_dead_letters_and_commits(
    stack: StackInfo, make_settings: Callable[..., Settings], unique: str
) -> None:
    version, topic = f"ovw-{unique}", f"rows-{unique}"
    settings = make_settings(STREAMRANK_EMBEDDING_OVERLAY_GROUP_ID=f"overlay-{unique}")
    await _publish(stack.redis_url, version)
    await create_topics(settings, topics=(topic, settings.topics.dead_letters))
    producer = AIOKafkaProducer(**settings.kafka.client_kwargs())
    await producer.start()
    try:
        for value in (
            b'{"id": "i1", "vector": [1, 1, 1, 1]}',
            b'{"id": "w-new", "vector": [2, 2, 2, 2]}',
            b'{"id": "bad", "vector": [1, 2]}',
            b"not json",
        ):
            await producer.send_and_wait(topic, value, key=b"k")
    finally:
        await producer.stop()
    worker = OverlayWorker(
        settings=settings, version=version, table="item", topic=topic, registry=CollectorRegistry()
    )
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:

        async def committed() -> bool:
            return await _committed(settings, topic) == 4

        await wait_for(committed, timeout_s=30, what="the rows' offsets to be committed")
        rows = await _rows(stack.redis_url, version, ["i1", "w-new"])
        assert rows.overlay is not None and rows.overlay.all()
        np.testing.assert_array_equal(
            rows.decode(), roundtrip(np.array([[1.0] * 4, [2.0] * 4]), "fp32")
        )
        letters = await read_topic(settings, settings.topics.dead_letters, want=2)
        reasons = sorted(decode_dead_letter(orjson.dumps(x)).reason for x in letters)
        assert reasons == ["bad_dim", "not_json"]
        assert (
            worker.metrics.registry.get_sample_value(
                "streamrank_embedding_overlay_upserted_rows_total"
            )
            == 2
        )
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 15)
        await worker.stop()
        await _delete(stack.redis_url, version)


async def _committed(settings: Settings, topic: str) -> int:
    consumer = AIOKafkaConsumer(
        **settings.kafka.client_kwargs(), group_id=settings.embeddings.overlay_group_id
    )
    await consumer.start()
    try:
        return (await consumer.committed(TopicPartition(topic, 0))) or 0
    finally:
        await consumer.stop()
