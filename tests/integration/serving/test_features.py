"""A version with counters and context through the scoring worker: other users' clicks on an
item raise its counter and move its score for a fixed user; a click after the request's time
changes nothing of that request; the served record carries the values the model used and
rescores to the served scores."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis

from schemas import ClickEvent
from scoring.client import RankClient
from scoring.embeddings.cache import CachedEmbeddings
from scoring.embeddings.store import EmbeddingStore
from scoring.model.features import FAMILIES
from scoring.model.registry import load_scorer_from_redis
from scoring.serving.features import ServedFeatures
from scoring.serving.served_log import rescore
from streamrank import clock
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from tests.integration.serving.test_worker import worker_settings
from tests.integration.support.features import writer_for
from tests.integration.support.scoring import (
    item_ids,
    publish,
    read_topic,
    running_worker,
    train_tiny_artifact,
)

pytestmark = pytest.mark.timeout(180)
HOUR_MS = 3_600_000
ITEM_CACHE_S = 3.0  # long enough for a loaded host to ask twice within it


@pytest.fixture(scope="module")
def features_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny_artifact(
        tmp_path_factory.mktemp("features-model"), seed=21, families=FAMILIES
    )


async def test_item_counters_move_the_score_as_of_the_request_time(
    make_settings: Callable[..., Settings],
    unique: str,
    redis: aioredis.Redis,
    features_artifact: Path,
) -> None:
    version = await publish(redis, features_artifact)
    settings = worker_settings(
        make_settings, unique, STREAMRANK_CANARY_SPLIT=f"{version}:1",
        STREAMRANK_SERVED_LOG_TOPIC=f"served-{unique}",
        STREAMRANK_FEATURES_ITEM_CACHE_S=ITEM_CACHE_S,
    )  # fmt: skip
    await create_topics(settings)
    await create_topics(settings, topics=(f"served-{unique}",))
    write = writer_for(settings, redis)
    known = item_ids(features_artifact)
    user, x, y = f"u-{unique}", known[7], known[8]
    # a fixed request time on a 5 min boundary; a click a minute before its hour counts in its
    # closed 1 h window (the 12 buckets before t) and in its closed 24 h one (the hours before)
    t = clock.now_ms() // 300_000 * 300_000
    counted = t // HOUR_MS * HOUR_MS - 60_000
    history = [ClickEvent(f"{unique}-h{k}", user, known[k], t - 2 * HOUR_MS + k, "c1")
               for k in range(4)]  # fmt: skip
    await write(history, clock.now_ms())
    async with running_worker(settings), RankClient(settings=settings) as client:
        before = await client.rank(user, [x, y], ts=t, timeout=30)
        # other users click x well inside the window, and once after the request's time
        others = [ClickEvent(f"{unique}-o{k}", f"o{k}-{unique}", x, counted, "c2")
                  for k in range(30)]  # fmt: skip
        later = [ClickEvent(f"{unique}-late", user, y, t + 1, "c1"),
                 ClickEvent(f"{unique}-late2", "someone", y, t + 60_000, "c1")]  # fmt: skip
        await write(others + later, clock.now_ms())
        # the clicks on x are late (their bucket had closed): a worker's item cache shows them
        # once its entries for x are older than item_cache_s
        stale = await client.rank(user, [x, y], ts=t, timeout=30)
        await asyncio.sleep(ITEM_CACHE_S + 0.1)
        after = await client.rank(user, [x, y], ts=t, timeout=30)
    assert stale.scores == before.scores
    assert not before.degraded and not after.degraded and after.model_version == version
    assert abs(after.scores[0] - before.scores[0]) > 1e-6  # x's counters moved its score
    assert after.scores[1] == pytest.approx(before.scores[1], abs=1e-7)  # y: nothing before t
    by_id = {r["request_id"]: r for r in await read_topic(settings, f"served-{unique}", want=3)}
    records = [by_id[before.request_id], by_id[after.request_id]]  # partitions keep no order
    first, second = (ServedFeatures.from_json(r["features"]) for r in records)
    assert first.as_of_ms == second.as_of_ms == t
    assert first.counters is not None and second.counters is not None
    assert second.counters[0][2:4] == [first.counters[0][2] + 30, first.counters[0][3] + 30]
    assert second.counters[1] == first.counters[1]  # the later clicks on y count nowhere
    assert [e for e in records[1]["sequence"]["event_ids"]] == [e.event_id for e in history]
    # each record rescores, from its own feature values, to the scores served
    scorer, _ = await load_scorer_from_redis(redis, version)
    embeddings = CachedEmbeddings(store=EmbeddingStore(redis=redis), cache_bytes=1 << 20)
    for record, result in zip(records, (before, after), strict=True):
        again = await rescore(record, scorer=scorer, embeddings=embeddings)
        np.testing.assert_allclose(again, result.scores, atol=1e-6)
