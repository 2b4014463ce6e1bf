"""The retrain loop through the real workers: a served log with clicks on what the active
version ranked first; a candidate worse on the held-out slice is refused (nothing published,
no rollout), an equal one is published and its staged rollout started, and a cycle while that
rollout runs is skipped. Every cycle is recorded."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from schemas import ClickEvent
from scoring.client import RankClient
from scoring.model.registry import activate_version
from scoring.rollout.cycles import recent_cycles
from scoring.rollout.state import RolloutStore
from streamrank import clock, keys
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from tests.integration.rollout.test_outcomes_worker import outcomes_worker
from tests.integration.support.scoring import (
    item_ids,
    publish,
    read_topic,
    running_worker,
    write_sequence,
)
from workbench.retrain import CyclePlan, RolloutPlan, run_cycle

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.standalone_only("online outcomes and rollouts need a standalone or Sentinel Redis"),
]
USERS = 8


@pytest.fixture
async def clean_rollout(redis: aioredis.Redis) -> AsyncIterator[None]:
    saved = await redis.get(keys.active_model())
    rollout_keys = (keys.rollout_state(), keys.rollout_history(), keys.rollout_lease())
    await redis.delete(*rollout_keys, keys.model_split(), keys.retrain_cycles())
    yield
    await redis.delete(*rollout_keys, keys.model_split(), keys.retrain_cycles())
    if saved is not None:
        await redis.set(keys.active_model(), saved)


async def serve_and_click_the_top_item(settings: Settings, redis: aioredis.Redis,
                                       known: list[str], unique: str) -> None:  # fmt: skip
    items = known[20:28]
    users = [f"rt-{unique}-{n}" for n in range(USERS)]
    for n, user in enumerate(users):
        await write_sequence(
            redis, user, [(f"h{n}-{k}", known[n + k], 1_000 + k) for k in range(3)]
        )
    producer = AIOKafkaProducer(**settings.kafka.client_kwargs())
    await producer.start()
    try:
        async with (
            running_worker(settings), outcomes_worker(settings),
            RankClient(settings=settings) as client,
        ):  # fmt: skip
            for n, user in enumerate(users):
                r = await client.rank(user, items, timeout=60)
                top = items[int(np.argmax(r.scores))]
                click = ClickEvent(f"c{n}-{unique}", user, top, ts=clock.now_ms())
                await producer.send_and_wait(settings.topics.clicks, click.to_json(),
                                             key=user.encode())  # fmt: skip
            got = await read_topic(
                settings, str(settings.topics.outcomes), want=USERS, timeout_s=60
            )
            assert len(got) == USERS
    finally:
        await producer.stop()


async def test_the_gate_refuses_a_worse_candidate_and_rolls_out_an_equal_one(
    make_settings: Callable[..., Settings], unique: str, redis: aioredis.Redis,
    own_version: Path, tmp_path: Path, clean_rollout: None,
) -> None:  # fmt: skip
    version = await publish(redis, own_version)
    artifacts = tmp_path / "artifacts"
    shutil.copytree(own_version, artifacts / version)
    env = dict(
        STREAMRANK_SCORING_GROUP_ID=f"scoring-{unique}", STREAMRANK_OUTCOMES_GROUP_ID=f"outcomes-{unique}",
        STREAMRANK_SERVED_LOG_TOPIC=f"served-{unique}", STREAMRANK_OUTCOMES_TOPIC=f"outcomes-{unique}",
        STREAMRANK_SCORING_BUDGET_MS=10_000, STREAMRANK_OUTCOME_BUCKET_S=1,
        STREAMRANK_OUTCOME_WINDOW_S=2, STREAMRANK_OUTCOME_CLOSE_DELAY_S=2,
        STREAMRANK_RETRAIN_DATASET_DIR=str(tmp_path / "datasets"), STREAMRANK_RETRAIN_EPOCHS=0,
        STREAMRANK_RETRAIN_HOLDOUT_SHARE=0.5, STREAMRANK_RETRAIN_GATE_MIN_SAMPLES=4,
    )  # fmt: skip
    settings = make_settings(**env)
    await create_topics(settings)
    await activate_version(redis, version)
    await serve_and_click_the_top_item(settings, redis, item_ids(own_version), unique)
    plan = CyclePlan(
        rollout=RolloutPlan(steps="5,100", hold_s=60, min_outcomes=10, guard="auc:0.05"),
        artifacts_dir=artifacts,
    )
    # from scratch with no training: untrained weights, worse than the version that served
    refused = await run_cycle(make_settings(**env, STREAMRANK_RETRAIN_WARM_START="false"), plan)
    assert refused.outcome == "refused", refused
    assert refused.gate["active"]["gauc"] == 1.0 > refused.gate["candidate"]["gauc"]
    assert refused.gate["candidate"]["n"] == USERS // 2 and refused.dataset["rows"] == USERS
    assert not await redis.exists(keys.model_config(str(refused.candidate)))
    assert await RolloutStore(redis=redis).read() is None
    assert await redis.get(keys.active_model()) == version.encode()
    # warm-started with no training: equal on the held-out slice, so published and rolled out
    published = await run_cycle(settings, plan)
    assert published.outcome == "published", published
    assert published.gate["candidate"]["gauc"] == published.gate["active"]["gauc"]
    state = await RolloutStore(redis=redis).read()
    assert state is not None and state.status == "running"
    assert (state.new, state.old) == (published.candidate, version)
    skipped = await run_cycle(settings, plan)
    assert skipped.outcome == "skipped" and "is running" in skipped.reason
    recorded = await recent_cycles(redis, 5)
    assert [c.outcome for c in recorded] == ["skipped", "published", "refused"]
