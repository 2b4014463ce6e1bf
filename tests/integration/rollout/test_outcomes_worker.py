"""The outcomes worker through Kafka: a scoring worker serves two versions side by side and logs
what it served; clicks arrive on the clicks topic; the worker's per-version statistics equal the
ones computed from the replies and the clicks in one go, each request's final outcome is
produced once its window closes, a redelivery of both streams changes nothing, and a broken
served record is dead-lettered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import orjson
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry

from schemas import ClickEvent, decode_dead_letter
from scoring.client import RankClient
from scoring.rollout.online import Window, read_stats
from scoring.rollout.stats import SCALARS_FLOAT, ranks_by_score, stats_of_requests
from scoring.rollout.worker import OutcomesWorker
from streamrank import clock
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from tests.integration.support.scoring import (
    item_ids,
    publish,
    read_topic,
    running_worker,
    wait_for,
)

pytestmark = [
    pytest.mark.timeout(400),
    pytest.mark.standalone_only(
        "online outcomes and rollouts need a standalone or Sentinel Redis (their join script is not cluster-safe yet)"
    ),
]


@contextlib.asynccontextmanager
async def outcomes_worker(settings: Settings) -> AsyncIterator[OutcomesWorker]:
    worker = OutcomesWorker(
        settings=settings, registry=CollectorRegistry(), close_every_s=0.3, export_every_s=0.5
    )
    await worker.start()
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.request_stop()
        try:
            await asyncio.wait_for(task, 15)
        finally:
            await worker.stop()


async def test_outcomes_through_kafka_equal_the_one_go_statistics(
    make_settings: Callable[..., Settings], unique: str, redis: aioredis.Redis,
    tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    va, vb = await publish(redis, tiny_artifacts[0]), await publish(redis, tiny_artifacts[1])
    settings = make_settings(
        STREAMRANK_SCORING_GROUP_ID=f"scoring-{unique}", STREAMRANK_OUTCOMES_GROUP_ID=f"outcomes-{unique}",
        STREAMRANK_SERVED_LOG_TOPIC=f"served-{unique}", STREAMRANK_OUTCOMES_TOPIC=f"outcomes-{unique}",
        STREAMRANK_CANARY_SPLIT=f"{va}:0.5,{vb}:0.5", STREAMRANK_SCORING_BUDGET_MS=10_000, STREAMRANK_OUTCOME_BUCKET_S=1,
        STREAMRANK_OUTCOME_WINDOW_S=10, STREAMRANK_OUTCOME_CLOSE_DELAY_S=5,  # a loaded machine lags: clicks still count
    )  # fmt: skip
    await create_topics(settings)
    items = item_ids(tiny_artifacts[0])[:8]
    users = [f"out-{unique}-{n}" for n in range(24)]
    start = clock.now_ms()
    producer = AIOKafkaProducer(**settings.kafka.client_kwargs())
    await producer.start()
    clicked: dict[str, list[int]] = {}

    async def send_click(event_id: str, user: str, item: str) -> None:
        click = ClickEvent(event_id=event_id, user_id=user, item_id=item, ts=clock.now_ms())
        await producer.send_and_wait(settings.topics.clicks, click.to_json(), key=user.encode())

    try:
        async with (
            running_worker(settings),
            outcomes_worker(settings) as worker,
            RankClient(settings=settings) as client,
        ):
            results = await asyncio.gather(*(client.rank(u, items, timeout=60) for u in users))
            for n, r in enumerate(results):
                ranks = ranks_by_score(r.scores)
                if n % 3 == 0:  # clicks the top item, and clicks it again (another event)
                    top = ranks.index(1)
                    clicked[r.request_id] = [top]
                    await send_click(f"c{n}-{unique}", r.user_id, items[top])
                    await send_click(f"c{n}b-{unique}", r.user_id, items[top])
                elif n % 3 == 1:  # clicks the items at ranks 3 and 5
                    picks = [ranks.index(3), ranks.index(5)]
                    clicked[r.request_id] = picks
                    for k, p in enumerate(picks):
                        await send_click(f"c{n}-{k}-{unique}", r.user_id, items[p])
                else:  # clicks nothing it was shown
                    clicked[r.request_id] = []
                    await send_click(f"c{n}-{unique}", r.user_id, "never-ranked")
            # a broken served record goes to the dead letters, the worker goes on
            await producer.send_and_wait(str(settings.topics.served_log), b'{"request_id": 7}')
            by_version = {v: [r for r in results if r.model_version == v] for v in (va, vb)}
            assert all(by_version.values()), "both versions served"
            window = Window(start - 1000, clock.now_ms() + 60_000, 1)
            want_clicks = sum(len(c) for c in clicked.values())

            async def all_joined() -> bool:
                stats = await read_stats(redis, [va, vb], window)
                return sum(s.clk for s in stats.values()) == want_clicks

            await wait_for(all_joined, timeout_s=60, what="every click to be attributed")
            stats = await read_stats(redis, [va, vb], window)
            for version, rows in by_version.items():
                want = stats_of_requests((r.scores, clicked[r.request_id]) for r in rows)
                got = stats[version]
                for name in ("req", "imp", "clk", "creq", "h1", "h5", "h10", "gn", "pos", "neg"):
                    assert getattr(got, name) == getattr(want, name), (version, name)
                for name in SCALARS_FLOAT:
                    assert getattr(got, name) == pytest.approx(getattr(want, name)), name
                assert sum(got.lat.values()) == len(rows) and got.deg == 0
            # each request's final outcome, once its window closed
            outcomes = await read_topic(settings, str(settings.topics.outcomes), want=len(users),
                                        timeout_s=60)  # fmt: skip
            assert sorted(o["request_id"] for o in outcomes) == sorted(
                r.request_id for r in results
            )
            for o in outcomes:
                assert sorted(items.index(c["item"]) for c in o["clicked"]) == sorted(
                    clicked[o["request_id"]]
                )
            letters = [decode_dead_letter(orjson.dumps(x)) for x in
                       await read_topic(settings, settings.topics.dead_letters, want=1)]  # fmt: skip
            assert [d.reason for d in letters] == ["bad_type"]
            assert worker.metrics.closed._value.get() == len(users)
            # the online gauges, per version and window, from the same statistics
            gauges = worker.metrics
            await wait_for(
                lambda: all(gauges.requests.labels(v, "10m")._value.get() == len(by_version[v])
                            for v in (va, vb)),
                timeout_s=30, what="the online gauges",
            )  # fmt: skip
            want_ctr1 = stats[va].h1 / stats[va].req
            assert gauges.ctr.labels(va, "1h", "1", "value")._value.get() == pytest.approx(
                want_ctr1
            )
            served = worker.metrics.served
            assert served.labels("joined")._value.get() == len(users)
    finally:
        await producer.stop()
    # both streams delivered again (a new group reads everything): nothing changes
    again = settings.with_env(STREAMRANK_OUTCOMES_GROUP_ID=f"again-{unique}")
    async with outcomes_worker(again) as second:
        await wait_for(lambda: second.metrics.served.labels("duplicate")._value.get() == len(users),
                       timeout_s=60, what="the redelivered served records")  # fmt: skip
        await asyncio.sleep(1.0)
    stats_after = await read_stats(redis, [va, vb], window)
    for version in (va, vb):
        assert stats_after[version] == stats[version]
