"""Helpers of the scoring integration tests: a tiny published model, a worker running
in-process, and topic readers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry

from scoring.serving.worker import ScoringWorker
from streamrank import keys
from streamrank.settings import Settings


def train_tiny_artifact(
    out_dir: Path, *, seed: int, families: tuple[str, ...] = ("sequence",)
) -> Path:
    """A really trained, tiny DIN (synthetic clicks, one epoch, small dims): seconds on a CPU."""
    from scoring.model.din import ModelSpec
    from scoring.training.export import export_artifact
    from scoring.training.synthetic import generate
    from scoring.training.train import TrainConfig, train_and_evaluate

    ds = generate(
        n_users=60, n_items=300, n_clusters=5, interests=2, events_per_user=(8, 14), seed=seed
    )
    spec = ModelSpec(
        item_dim=8, id_dim=4, category_dim=4, attention_hidden=(8, 4), mlp_hidden=(8, 4)
    )
    cfg = TrainConfig(
        epochs=1, batch_size=128, n_negatives=4, history_len=20, seed=seed, spec=spec,
        families=families, select="features" if families != ("sequence",) else "best",
        time_split=False,  # only the served model is needed
    )  # fmt: skip
    result = train_and_evaluate(ds, cfg, progress=False)
    return Path(export_artifact(result, ds, cfg, out_dir, encoding="int8"))


async def publish(redis: aioredis.Redis, artifact_dir: Path) -> str:
    """Publish an artifact through the real registry path; returns its version."""
    from scoring.model.artifact import load_artifact
    from scoring.model.registry import publish_artifact

    artifact = load_artifact(artifact_dir)
    if not await redis.exists(keys.model_config(artifact.version)):
        await publish_artifact(redis, artifact, progress=False)
    return str(artifact.version)


def item_ids(artifact_dir: Path) -> list[str]:
    from scoring.model.artifact import load_artifact

    return list(load_artifact(artifact_dir).item_ids)


async def write_sequence(
    redis: aioredis.Redis, user_id: str, events: Sequence[tuple[str, str, int]]
) -> None:
    """``(event_id, item_id, ts)`` events in the feature store's sequence layout."""
    members = {keys.sequence_member(e, i, None): ts for e, i, ts in events}
    await redis.zadd(keys.sequence(user_id), members)


async def offline_scores(
    redis: aioredis.Redis, version: str, history: Sequence[str], items: Sequence[str]
) -> np.ndarray:
    """The same version's scores computed outside the worker: store rows + DinScorer, B=1."""
    from scoring.embeddings.store import EmbeddingStore
    from scoring.model.registry import load_scorer_from_redis
    from scoring.serving.assemble import assemble, gather

    scorer, _ = await load_scorer_from_redis(redis, version)
    batch = assemble([list(history)], [list(items)], max_history=max(1, len(history)))
    rows = await EmbeddingStore(redis=redis).lookup("item", batch.unique_ids, version=version)
    hist, cands = gather(np.asarray(rows, dtype=np.float32), batch)
    return np.asarray(scorer.score(hist, batch.hist_mask, cands, batch.cand_mask))[0]


@contextlib.asynccontextmanager
async def running_worker(settings: Settings, **injected: Any) -> AsyncIterator[ScoringWorker]:
    """A scoring worker with the real dependencies (less those ``injected``, keyword arguments
    of :class:`ScoringWorker`), as a task of this event loop."""
    worker = ScoringWorker(settings=settings, registry=CollectorRegistry(), **injected)
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.request_stop()
        try:
            await asyncio.wait_for(task, 10)
        finally:
            await worker.stop()
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


async def read_topic(
    settings: Settings, topic: str, *, want: int, timeout_s: float = 20.0
) -> list[Any]:
    """The first ``want`` JSON messages of a topic (from the beginning), or fewer at timeout."""
    consumer = AIOKafkaConsumer(
        topic, **settings.kafka.client_kwargs(), auto_offset_reset="earliest",
        enable_auto_commit=False, group_id=None,
    )  # fmt: skip
    await consumer.start()
    out: list[Any] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < want and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                out.extend(orjson.loads(r.value) for r in records)
    finally:
        await consumer.stop()
    return out


PREDICATE_TIMEOUT_S = 5.0  # one poll of wait_for's predicate


async def wait_for(predicate: Any, *, timeout_s: float, what: str) -> None:
    """Poll an (async) predicate until it holds; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            # A Kafka call that never answers must not hang the test past its deadline: a CI
            # run hung here for 10+ minutes with the offsets already committed (a committed()
            # call that never returned; pytest-timeout's alarm did not end it). Each poll is
            # bounded, then the predicate is polled again.
            left = max(0.1, min(PREDICATE_TIMEOUT_S, deadline - time.monotonic()))
            try:
                value = await asyncio.wait_for(value, left)
            except TimeoutError:
                continue
        if value:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


async def committed_total(settings: Settings) -> int:
    """Sum over the request topic's partitions of the scoring group's committed offsets."""
    from aiokafka import TopicPartition

    consumer = AIOKafkaConsumer(
        **settings.kafka.client_kwargs(), group_id=settings.scoring.group_id,
        enable_auto_commit=False,
    )  # fmt: skip
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        partitions = consumer.partitions_for_topic(settings.topics.requests) or set()
        total = 0
        for p in partitions:
            total += await consumer.committed(TopicPartition(settings.topics.requests, p)) or 0
        return total
    finally:
        # stopping a consumer whose call was cancelled by wait_for's bound must not hang either
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(consumer.stop(), PREDICATE_TIMEOUT_S)
