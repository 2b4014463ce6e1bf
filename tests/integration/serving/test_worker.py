"""The scoring worker on the real broker and Redis, with a really trained (tiny) DIN published
through the registry: normal path, cold start, OOV, deadlines, bad requests, Redis outage and
recovery, version switch under load, canary split, and the served log."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from schemas import ClickEvent, reasons
from scoring.client import RankClient
from scoring.model.canary import assign, parse_split
from scoring.model.versions import set_split
from scoring.serving.served_log import rescore
from streamrank import keys
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from tests.integration.support.features import writer_for
from tests.integration.support.scoring import (
    committed_total,
    item_ids,
    offline_scores,
    publish,
    read_topic,
    running_worker,
    wait_for,
    write_sequence,
)
from workbench.devstack.servers import private_redis

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
async def no_split_left(redis: aioredis.Redis) -> AsyncIterator[None]:
    yield
    await redis.delete(keys.model_split())


@pytest.fixture
async def versions(redis: aioredis.Redis, tiny_artifacts: tuple[Path, Path]) -> tuple[str, str]:
    a, b = tiny_artifacts
    va, vb = await publish(redis, a), await publish(redis, b)
    assert va != vb
    await redis.set(keys.active_model(), va)
    return va, vb


def worker_settings(make_settings: Callable[..., Settings], unique: str, **kw: object) -> Settings:
    base: dict[str, object] = {
        "STREAMRANK_SCORING_GROUP_ID": f"scoring-{unique}",
        "STREAMRANK_SCORING_BUDGET_MS": 10_000,  # a loaded CI machine must not turn replies into "expired"
        "STREAMRANK_SCORING_POLL_S": 0.2,
        "STREAMRANK_BREAKER_COOLDOWN_S": 0.5,
    }
    base.update(kw)
    return make_settings(**base)


# Sequences come in one pipeline per node and item rows from one script call per slot group.
@pytest.mark.cluster
async def test_normal_path_cold_start_and_oov(
    make_settings: Callable[..., Settings], unique: str, redis: aioredis.Redis,
    versions: tuple[str, str], tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    va, _ = versions
    settings = worker_settings(make_settings, unique)
    await create_topics(settings)
    known = item_ids(tiny_artifacts[0])
    history = known[:6]
    user = f"u-{unique}"
    await write_sequence(redis, user, [(f"e{k:03d}", i, 1_000 + k) for k, i in enumerate(history)])
    items = [known[10], known[11], known[12], f"never-seen-{unique}"]
    async with running_worker(settings) as worker, RankClient(settings=settings) as client:
        result = await client.rank(user, items, timeout=30)
        cold = await client.rank(f"cold-{unique}", items, timeout=10)
    assert result.model_version == va and not result.degraded and result.reason is None
    assert result.items == tuple(items)
    assert np.allclose(result.scores, await offline_scores(redis, va, history, items), atol=1e-5)
    assert set(result.timings_ms) >= {"queue_wait", "sequence_fetch", "embedding_lookup",
                                      "forward", "total"}  # fmt: skip
    # a cold-start user is scored on the candidates alone: the history made a difference
    assert not cold.degraded and cold.model_version == va
    assert np.allclose(cold.scores, await offline_scores(redis, va, [], items), atol=1e-5)
    assert np.abs(np.subtract(cold.scores, result.scores)).max() > 1e-6
    # an unknown item is scored with the table's OOV row: same as any other unknown id
    oov_other = await offline_scores(redis, va, history, ["another-unknown"])
    assert result.scores[3] == pytest.approx(float(oov_other[0]), abs=1e-5)
    ok = worker.metrics.requests.labels("ok", "", settings.topics.results)._value.get()
    assert ok == 2
    assert await committed_total(settings) == 2  # both answered requests are committed


async def test_expired_deadline_gets_a_degraded_reply_without_compute(
    make_settings: Callable[..., Settings], unique: str, versions: tuple[str, str]
) -> None:
    settings = worker_settings(make_settings, unique)
    await create_topics(settings)
    async with running_worker(settings) as worker, RankClient(settings=settings) as client:
        await client.rank("warm", ["a"], timeout=30)
        result = await client.rank("u1", ["a", "b"], timeout=10,
                                   deadline_ms=int(time.time() * 1000) - 1000)  # fmt: skip
        assert result.degraded and result.reason == reasons.EXPIRED
        assert result.scores == (0.5, 0.5)
        assert "forward" not in result.timings_ms
        assert (
            worker.metrics.requests.labels(
                "degraded", "expired", settings.topics.results
            )._value.get()
            == 1
        )


async def test_bad_requests_go_to_dead_letters_with_error_replies(
    make_settings: Callable[..., Settings], unique: str, versions: tuple[str, str]
) -> None:
    allowed = f"svc-replies-{unique}"
    settings = worker_settings(make_settings, unique, STREAMRANK_MAX_ITEMS_PER_REQUEST=5, STREAMRANK_MAX_ID_LENGTH=40,
                               STREAMRANK_REPLY_TOPICS_ALLOWED=(allowed,))  # fmt: skip
    await create_topics(settings)
    await create_topics(settings, topics=(allowed,))
    bad = [
        b"{not json",
        orjson.dumps({"request_id": "bad-empty", "user_id": "u", "items": []}),
        orjson.dumps({"request_id": "bad-many", "user_id": "u", "items": list("abcdefg")}),
        orjson.dumps({"request_id": "bad-long", "user_id": "u" * 50, "items": ["a"]}),
        orjson.dumps(
            {
                "request_id": "bad-reply",
                "user_id": "u",
                "items": ["a"],
                "reply_to": settings.topics.clicks,
            }
        ),
        # invalid, but names an allowed reply topic: the error reply goes there
        orjson.dumps(
            {"request_id": "bad-routed", "user_id": "u", "items": [], "reply_to": allowed}
        ),
    ]
    async with running_worker(settings), RankClient(settings=settings) as client:
        await client.rank("warm", ["a"], timeout=30)
        producer = AIOKafkaProducer(**settings.kafka.client_kwargs())
        await producer.start()
        try:
            for raw in bad:
                await producer.send_and_wait(settings.topics.requests, raw, key=b"u")
        finally:
            await producer.stop()
        with pytest.raises(ValueError, match="items=None"):  # refused before it is sent
            await client.rank("u1", [], timeout=10)
        # the worker is still alive and answers a good request, also on an allowed reply topic
        good = await client.rank("u1", ["a", "b"], timeout=10)
        assert not good.degraded
        async with RankClient(settings=settings, reply_topic=allowed) as other:
            routed = await other.rank("u1", ["a"], timeout=10)
            assert not routed.degraded
    letters = await read_topic(settings, settings.topics.dead_letters, want=5)
    reasons = sorted(letter["error"].split(":", 1)[0] for letter in letters)
    assert reasons == ["empty_items", "empty_items", "not_json", "too_long", "too_many_items"]
    assert {letter["source_topic"] for letter in letters} == {settings.topics.requests}
    assert any(letter["payload"] == "{not json" for letter in letters)
    results = await read_topic(settings, settings.topics.results, want=20, timeout_s=3)
    errors = {r["request_id"]: r["reason"] for r in results if r["request_id"].startswith("bad-")}
    assert set(errors) == {"bad-empty", "bad-many", "bad-long", "bad-reply"}
    assert errors.pop("bad-reply").startswith("reply_to_not_allowed")
    assert all(reason.startswith("invalid_request") for reason in errors.values())
    routed_errors = await read_topic(settings, allowed, want=2, timeout_s=3)
    assert [
        r["reason"].split(":")[0] for r in routed_errors if r["request_id"] == "bad-routed"
    ] == ["invalid_request"]


@pytest.mark.standalone_only(
    "stops and starts a private redis-server; the cluster's failover is tests/integration/app/test_failover.py"
)
async def test_redis_down_gives_degraded_replies_then_back_to_normal(
    make_settings: Callable[..., Settings], unique: str, tiny_artifacts: tuple[Path, Path],
    tmp_path: Path,
) -> None:  # fmt: skip
    with private_redis(tmp_path) as server:
        settings = worker_settings(make_settings, unique, STREAMRANK_REDIS_URL=server.url,
                                   STREAMRANK_REDIS_TIMEOUT_S=0.2, STREAMRANK_BREAKER_FAILURES=2,
                                   STREAMRANK_CASCADE_HOT_REFRESH_S=0.1)  # fmt: skip
        await create_topics(settings)
        client_redis = aioredis.from_url(server.url)
        version = await publish(client_redis, tiny_artifacts[0])
        await client_redis.set(keys.active_model(), version)
        two_hours_ago = int(time.time() * 1000) - 7_200_000  # a closed bucket of both windows
        hot = [ClickEvent(f"e{k}", "u9", "hot-a" if k % 3 else "hot-b", two_hours_ago + k)
               for k in range(5)]  # fmt: skip
        assert await writer_for(settings, client_redis)(hot, two_hours_ago) == 5
        await client_redis.aclose()
        items = item_ids(tiny_artifacts[0])[:5]
        async with running_worker(settings) as worker, RankClient(settings=settings) as client:
            before = await client.rank("u1", items, timeout=30)
            assert not before.degraded and before.model_version == version
            pool = worker.hot_pool
            assert pool is not None and pool.items() == ("hot-a", "hot-b")  # read at start
            server.stop()
            await wait_for(lambda: pool.failures >= 2, timeout_s=10, what="failed pool refreshes")
            assert pool.items() == ("hot-a", "hot-b")  # Redis down: the last snapshot stays
            down = [await client.rank("u1", items, timeout=10) for _ in range(4)]
            assert all(r.degraded for r in down)
            assert {r.reason for r in down} <= {reasons.REDIS_UNAVAILABLE, reasons.BREAKER_OPEN}
            assert reasons.BREAKER_OPEN in {r.reason for r in down}  # the breaker opened
            assert all(len(r.scores) == len(items) for r in down)
            # a retrieval request gets the worker's own hot pool (its last snapshot)
            pooled = await client.rank("u7", top_k=2, timeout=10)
            assert pooled.degraded and pooled.items == ("hot-a", "hot-b")
            assert pooled.reason in {reasons.REDIS_UNAVAILABLE, reasons.BREAKER_OPEN}
            assert worker.metrics.redis_errors._value.get() >= 2
            server.start()
            last: list[object] = []

            async def normal_again() -> bool:
                r = await client.rank("u1", items, timeout=10)
                last.append(r)
                return not r.degraded

            await wait_for(normal_again, timeout_s=20, what="normal replies after Redis is back")
            assert np.allclose(last[-1].scores, before.scores, atol=1e-6)  # type: ignore[attr-defined]
            await wait_for(lambda: pool.failures == 0, timeout_s=10, what="a pool refresh")
            assert pool.items() == ("hot-a", "hot-b") and pool.running
            assert worker.metrics.hot_pool_failures._value.get() >= 2
        assert not pool.running  # stopped with the worker


async def test_version_switch_under_load_leaves_no_request_unanswered(
    make_settings: Callable[..., Settings], unique: str, redis: aioredis.Redis,
    versions: tuple[str, str], tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    va, vb = versions
    settings = worker_settings(make_settings, unique)
    await create_topics(settings)
    items = item_ids(tiny_artifacts[0])[:20]
    async with running_worker(settings) as worker, RankClient(settings=settings) as client:
        await client.rank("warm", items, timeout=30)
        pending = []
        for n in range(240):  # ~3 s at ~80 req/s, switching a third of the way in
            pending.append(asyncio.ensure_future(client.rank(f"user{n % 37}", items, timeout=30)))
            if n == 80:
                await redis.set(keys.active_model(), vb)
            await asyncio.sleep(0.0125)
        results = await asyncio.gather(*pending)
        assert worker.watcher is not None and worker.watcher.describe() == f"{vb}:1"
    assert len(results) == 240 and not any(r.degraded for r in results)
    served = [r.model_version for r in results]
    assert served[0] == va and served[-1] == vb
    first_b = served.index(vb)
    assert all(v == vb for v in served[first_b:]) or served[first_b:].count(va) <= 32
    assert set(served) == {va, vb}


async def test_canary_split_is_stable_per_user(
    make_settings: Callable[..., Settings], unique: str, redis: aioredis.Redis,
    versions: tuple[str, str], tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    va, vb = versions
    settings = worker_settings(make_settings, unique)
    await create_topics(settings)
    split_text = f"{va}:0.5,{vb}:0.5"
    await set_split(redis, split_text)
    items = item_ids(tiny_artifacts[0])[:5]
    users = [f"canary-{unique}-{n}" for n in range(40)]
    async with running_worker(settings) as worker, RankClient(settings=settings) as client:
        await wait_for(lambda: worker.watcher is not None and vb in worker.watcher.describe(),
                       timeout_s=10, what="the split to be served")  # fmt: skip
        first = await asyncio.gather(*(client.rank(u, items, timeout=30) for u in users))
        again = await asyncio.gather(*(client.rank(u, items, timeout=30) for u in users))
    expected = assign(users, parse_split(split_text))
    assert [r.model_version for r in first] == expected
    assert [r.model_version for r in again] == expected
    assert set(expected) == {va, vb}
    for r in first:  # each version scores with its own weights and table
        assert np.allclose(r.scores, await offline_scores(redis, r.model_version, [], items),
                           atol=1e-5)  # fmt: skip


async def test_served_log_record_rescored_offline_gives_the_logged_scores(
    make_settings: Callable[..., Settings], unique: str, redis: aioredis.Redis,
    versions: tuple[str, str], tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    from scoring.embeddings.cache import CachedEmbeddings
    from scoring.embeddings.store import EmbeddingStore
    from scoring.model.registry import load_scorer_from_redis

    va, _ = versions
    log_topic = f"served-{unique}"
    settings = worker_settings(make_settings, unique, STREAMRANK_SERVED_LOG_TOPIC=log_topic)
    await create_topics(settings)
    await create_topics(settings, topics=(log_topic,))
    known = item_ids(tiny_artifacts[0])
    user = f"logged-{unique}"
    events = [(f"e{k:03d}", i, 5_000 + k) for k, i in enumerate(known[20:27])]
    await write_sequence(redis, user, events)
    items = known[30:40]
    async with running_worker(settings), RankClient(settings=settings) as client:
        results = [await client.rank(user, items, timeout=30)]
        results += await asyncio.gather(*(client.rank(f"other{n}", known[:9], timeout=30)
                                          for n in range(6)))  # fmt: skip
    records = await read_topic(settings, log_topic, want=7)
    record = next(r for r in records if r["request_id"] == results[0].request_id)
    assert record["model_version"] == va and record["user_id"] == user
    assert record["sequence"]["item_ids"] == [i for _, i, _ in events]
    assert record["sequence"]["event_ids"] == [e for e, _, _ in events]
    assert record["sequence"]["ts"] == [t for _, _, t in events]
    assert record["items"] == items and record["scores"] == list(results[0].scores)
    scorer, _ = await load_scorer_from_redis(redis, va)
    embeddings = CachedEmbeddings(store=EmbeddingStore(redis=redis), cache_bytes=1 << 20)
    for rec in records:
        again = await rescore(rec, scorer=scorer, embeddings=embeddings)
        assert np.allclose(again, rec["scores"], atol=1e-5)


async def test_batch_fetched_after_a_rewind_commits_normally(
    make_settings: Callable[..., Settings], unique: str, versions: tuple[str, str]
) -> None:
    """The batch before this one failed to produce and rewound the consumer *before* this one
    was fetched: this batch's records do not come again, so it must answer and commit (it used
    to return False because the batch before did, and so did every later batch: no commit
    again while batches kept arriving)."""
    settings = worker_settings(make_settings, unique)
    await create_topics(settings)
    from prometheus_client import CollectorRegistry

    from schemas import RankRequest
    from scoring.serving.worker import ScoringWorker

    producer = AIOKafkaProducer(**settings.kafka.client_kwargs())
    await producer.start()
    try:
        for k in range(3):
            request = RankRequest(f"r{k}-{unique}", f"u{k}", ("a", "b"))
            await producer.send_and_wait(settings.topics.requests, request.to_json(), key=b"u")
    finally:
        await producer.stop()

    async def rewound_earlier() -> bool:
        return False

    worker = ScoringWorker(settings=settings, registry=CollectorRegistry())
    await worker.start()
    try:
        before = asyncio.create_task(rewound_earlier())
        await before
        records: list = []
        deadline = time.monotonic() + 30
        while len(records) < 3 and time.monotonic() < deadline:
            records.extend(await worker._next_batch())
        assert len(records) == 3
        assert await worker.process(records, after=before, rewinds=worker.rewinds) is True
        await worker.commit_answered()
        assert await committed_total(settings) == 3
        # a rewind after the fetch still holds the commit back (the records come again)
        assert await worker.process(records, after=before, rewinds=worker.rewinds - 1) is False
    finally:
        await worker.stop()


async def test_an_idle_worker_commits_what_the_interval_held_back(
    make_settings: Callable[..., Settings], unique: str, versions: tuple[str, str]
) -> None:
    """With a long commit interval the last answered batch is not yet due; once no request
    arrives it is committed anyway, so the group's lag reaches 0 while the worker runs."""
    settings = worker_settings(make_settings, unique, STREAMRANK_SCORING_COMMIT_INTERVAL_MS=600_000)
    await create_topics(settings)
    async with running_worker(settings), RankClient(settings=settings) as client:
        for n in range(3):
            await client.rank(f"u{n}", ["a", "b"], timeout=30)

        async def all_committed() -> bool:
            return await committed_total(settings) == 3

        await wait_for(all_committed, timeout_s=20, what="the idle commit")


async def test_a_batch_of_a_partition_moved_away_meanwhile_is_answered_without_crashing(
    make_settings: Callable[..., Settings], unique: str, versions: tuple[str, str]
) -> None:
    """A rebalance can take a partition away while one of its batches is being scored: the
    batch is still answered, and the lag gauge skips the partition (reading its high watermark
    raised an AssertionError that stopped the worker)."""
    from aiokafka import ConsumerRecord
    from prometheus_client import CollectorRegistry

    from schemas import RankRequest
    from scoring.serving.worker import ScoringWorker

    settings = worker_settings(make_settings, unique)
    await create_topics(settings)
    worker = ScoringWorker(settings=settings, registry=CollectorRegistry())
    await worker.start()
    try:
        value = RankRequest(f"r-moved-{unique}", "u1", ("a", "b")).to_json()
        moved = ConsumerRecord(
            topic=settings.topics.requests, partition=settings.topics.partitions + 5, offset=0,
            timestamp=int(time.time() * 1000), timestamp_type=0, key=b"u1", value=value,
            checksum=None, serialized_key_size=2, serialized_value_size=len(value), headers=(),
        )  # fmt: skip
        assert await worker.process([moved]) is True
        [reply] = await read_topic(settings, settings.topics.results, want=1)
        assert reply["request_id"] == f"r-moved-{unique}"
    finally:
        await worker.stop()
