"""The cascade in a scoring worker on the real broker and Redis, with a really trained (tiny) DIN
and an exact in-test retriever: a retrieval reply, its cached repeat, Redis paused (the cached
result, else the hot pool), and a version whose index cannot be loaded (the hot pool as
candidates). Also the result cache's Redis mode, shared by two workers' caches."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import redis.asyncio as aioredis

from schemas import RankRequest, RankResult, reasons
from scoring.client import RankClient
from scoring.serving.result_cache import CachedResult, ResultCache, ResultKey
from scoring.serving.served_log import rescore
from streamrank import keys
from streamrank.errors import ArtifactError
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from tests.integration.support.scoring import (
    item_ids,
    offline_scores,
    publish,
    read_topic,
    running_worker,
    wait_for,
    write_sequence,
)
from tests.unit.serving.cascade_fakes import BruteForceRetriever, StaticHot
from workbench.devstack.servers import private_redis

pytestmark = pytest.mark.timeout(180)


async def retrieve(client: RankClient, user: str, **fields: Any) -> RankResult:
    return await client.rank(user, timeout=30, **fields)


def settings_for(make_settings: Callable[..., Settings], unique: str, url: str) -> Settings:
    return make_settings(
        STREAMRANK_SCORING_GROUP_ID=f"scoring-{unique}",
        STREAMRANK_SERVED_LOG_TOPIC=f"served-{unique}",
        STREAMRANK_REDIS_URL=url,
        STREAMRANK_SCORING_POLL_S=0.2,
        # A Redis wait is cut at the deadline, but never below half this budget.
        STREAMRANK_SCORING_BUDGET_MS=400,
        # A loaded CI machine must not turn the normal replies into fallbacks.
        STREAMRANK_CASCADE_BUDGET_MS=20_000,
        STREAMRANK_CASCADE_BUDGET_RETRIEVAL_MS=3000,
        STREAMRANK_CASCADE_BUDGET_RANK_MS=5000,
        STREAMRANK_CASCADE_RETRIEVE=60,
        STREAMRANK_CASCADE_COARSE=20,
    )


@pytest.mark.standalone_only("pauses a private redis-server")
async def test_the_rungs_show_in_the_replies(
    make_settings: Callable[..., Settings], unique: str, tiny_artifacts: tuple[Path, Path],
    tmp_path: Path,
) -> None:  # fmt: skip
    known = item_ids(tiny_artifacts[0])
    hot = StaticHot(known[-30:])
    history = known[:6]
    with private_redis(tmp_path) as server:
        settings = settings_for(make_settings, unique, server.url)
        await create_topics(settings)
        await create_topics(settings, topics=(f"served-{unique}",))
        redis = aioredis.from_url(server.url)
        va, vb = await publish(redis, tiny_artifacts[0]), await publish(redis, tiny_artifacts[1])
        await redis.set(keys.active_model(), va)
        await write_sequence(redis, "u1", [(f"e{k}", i, 1_000 + k) for k, i in enumerate(history)])

        def retriever_of(version: str) -> BruteForceRetriever:
            if version != va:
                raise ArtifactError(f"{version} ships no retrieval index")
            return BruteForceRetriever(known)

        async with (
            running_worker(settings, retrievers=retriever_of, hot=hot) as worker,
            RankClient(settings=settings) as client,
        ):
            first = await retrieve(client, "u1", top_k=5)
            again = await retrieve(client, "u1", top_k=5)
            # Redis paused: the cached result for u1, the hot pool for a user never served
            await redis.execute_command("CLIENT", "PAUSE", 3000)
            deadline = int(time.time() * 1000) + 800
            cached, pooled = await asyncio.gather(
                retrieve(client, "u1", top_k=5, deadline_ms=deadline),
                retrieve(client, "u2", top_k=5, deadline_ms=deadline),
            )
            await asyncio.sleep(2.5)  # the pause ends
            # a version whose index cannot be loaded: the hot pool as candidates
            await redis.set(keys.active_model(), vb)
            await wait_for(lambda: worker.watcher is not None and worker.watcher.describe() == f"{vb}:1",
                           timeout_s=20, what="the switch to the version without an index")  # fmt: skip
            fallback = await retrieve(client, "u1", top_k=5)
            fallbacks = worker.metrics.cascade_fallbacks
            counted = {
                (s.labels["stage"], s.labels["reason"]): s.value
                for metric in fallbacks.collect() for s in metric.samples
                if s.name.endswith("_total")
            }  # fmt: skip
        offline = await offline_scores(redis, va, history, first.items)
        records = await read_topic(settings, f"served-{unique}", want=5)
        await check_served_log(redis, records, va, [first, again, cached, pooled, fallback])
        await redis.aclose()

    assert not first.degraded and not first.cached and first.model_version == va
    assert 0 < len(first.items) <= 5 and len(set(first.items)) == len(first.items)
    assert not set(first.items) & set(history)  # seen items are filtered
    assert list(first.scores) == sorted(first.scores, reverse=True)
    np.testing.assert_allclose(first.scores, offline, atol=1e-5)  # the DIN scores, as offline
    assert {"retrieval", "filter", "coarse", "rank", "rerank"} <= set(first.timings_ms)

    assert again.cached and not again.degraded and again.items == first.items
    assert "retrieval" not in again.timings_ms

    assert cached.degraded and cached.cached and cached.reason == reasons.CACHED_FALLBACK
    assert cached.items == first.items
    assert pooled.degraded and pooled.reason == reasons.REDIS_UNAVAILABLE and not pooled.cached
    assert list(pooled.items) == list(hot.items()[:5])

    assert fallback.degraded and fallback.reason == reasons.RETRIEVAL_FALLBACK
    assert fallback.model_version == vb and set(fallback.items) <= set(hot.items())
    assert counted == {
        ("features", reasons.CACHED_FALLBACK): 1.0,
        ("features", reasons.REDIS_UNAVAILABLE): 1.0,
        ("retrieval", reasons.RETRIEVAL_FALLBACK): 1.0,
    }


async def check_served_log(
    redis: aioredis.Redis, records: list[Any], version: str, replies: list[RankResult]
) -> None:
    """Every reply is logged with the items it showed, in a record the outcomes worker reads;
    the scored ones (and the cached repeat) rescore to the logged scores."""
    from scoring.embeddings.cache import CachedEmbeddings
    from scoring.embeddings.store import EmbeddingStore
    from scoring.model.registry import load_scorer_from_redis
    from scoring.rollout.records import decode_served

    by_id = {r["request_id"]: r for r in records}
    assert set(by_id) == {r.request_id for r in replies}
    scorer, _ = await load_scorer_from_redis(redis, version)
    embeddings = CachedEmbeddings(store=EmbeddingStore(redis=redis), cache_bytes=1 << 20)
    for reply in replies:
        record = by_id[reply.request_id]
        served = decode_served(orjson.dumps(record))
        assert served.items == reply.items and served.scores == reply.scores
        assert served.degraded == reply.degraded
        if not reply.degraded:
            again = await rescore(record, scorer=scorer, embeddings=embeddings)
            np.testing.assert_allclose(again, reply.scores, atol=1e-5)
    assert by_id[replies[1].request_id]["cached"] is True


@pytest.mark.cluster
async def test_results_in_redis_are_shared_and_expire(redis: aioredis.Redis, unique: str) -> None:
    writer = ResultCache(mode="redis", ttl_s=5.0, entries=10, redis=redis)
    reader = ResultCache(mode="redis", ttl_s=5.0, entries=10, redis=redis)
    key = ResultKey.of(RankRequest("r", f"u-{unique}"), "v1", 10)
    other = ResultKey.of(RankRequest("r", f"w-{unique}"), "v1", 10)
    stored = CachedResult("9:e2", ("a", "b"), (0.5, 0.25), {"as_of": 7})
    writer.store([(key, stored), (other, stored)])
    await writer.drain()

    def no_bound() -> asyncio.Timeout:
        return asyncio.timeout(5)

    found = await reader.lookup([key, key, other], ["9:e2", "10:e3", "9:e2"], bound=no_bound)
    assert found == [stored, None, stored]  # another sequence version is a miss
    ttl = await redis.pttl(key.redis_key())
    assert 0 < ttl <= 5000
    await redis.set(other.redis_key(), b"not json", px=5000)
    assert await ResultCache(mode="redis", ttl_s=5.0, entries=10, redis=redis).lookup(
        [other], ["9:e2"], bound=no_bound
    ) == [None]
    await redis.delete(key.redis_key(), other.redis_key())
