"""STREAMRANK_LOG_FORMAT=json on both workers: every log line is one JSON object, and one
user's click and ranking request can be followed through the features and the scoring worker
by user_id, with request_id, model_version and the record's partition/offset on the lines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from scoring.client import RankClient
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from tests.integration.support.features import click, poll, produce, sequence_members
from tests.integration.support.scoring import item_ids, publish
from workbench.devstack.processes import start_worker

pytestmark = pytest.mark.timeout(240)
JSON_DEBUG = {"STREAMRANK_LOG_FORMAT": "json", "STREAMRANK_LOG_LEVEL": "DEBUG"}


def json_log(path: Path) -> list[dict[str, Any]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    parsed = []
    for line in lines:
        try:
            parsed.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            raise AssertionError(f"{path.name}: not a JSON line: {line[:300]!r}") from None
    return parsed


async def test_one_user_is_followed_through_both_workers_in_json_logs(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    settings = make_settings(
        STREAMRANK_FEATURES_APP_ID=f"features-{unique}", STREAMRANK_SCORING_GROUP_ID=f"scoring-{unique}",
        STREAMRANK_SCORING_BUDGET_MS=10_000,
    )  # fmt: skip
    await create_topics(settings)
    redis = redis_client(settings.redis)
    try:
        version = await publish(redis, tiny_artifacts[0])
    finally:
        await redis.aclose()
    pinned = settings.with_env(STREAMRANK_CANARY_SPLIT=f"{version}:1")
    logs = {kind: tmp_path / f"{kind}.log" for kind in ("features", "scoring")}
    handles = [
        start_worker(kind, pinned, log_path=logs[kind], metrics_port=0, extra_env=JSON_DEBUG)
        for kind in logs
    ]
    user = f"u-{unique}"
    items = item_ids(tiny_artifacts[0])[:4]
    try:
        for handle in handles:
            await asyncio.to_thread(handle.wait_ready, 120)
        now = int(time.time() * 1000)
        await produce(settings, [(user.encode(), click(f"e1-{unique}", user, items[0], now))])

        async def applied() -> bool:
            return bool((await sequence_members(settings, [user]))[user])

        await poll(applied, timeout_s=30, what="the click in the user's sequence")
        async with RankClient(settings=settings) as client:
            result = await client.rank(user, items, timeout=60)
        await asyncio.sleep(1)  # the reply line is written before the ack; let it flush
    finally:
        for handle in handles:
            handle.stop()

    features = json_log(logs["features"])
    scoring = json_log(logs["scoring"])
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in features + scoring)
    [seen] = [r for r in features if r.get("user_id") == user]
    assert seen["event_id"] == f"e1-{unique}" and seen["topic"] == settings.topics.clicks
    assert isinstance(seen["partition"], int) and isinstance(seen["offset"], int)
    [reply] = [r for r in scoring if r.get("request_id") == result.request_id]
    assert reply["user_id"] == user and reply["model_version"] == version == result.model_version
    assert (
        reply["topic"] == settings.topics.requests
        and reply["reply_topic"] == settings.topics.results
    )
    assert isinstance(reply["partition"], int) and isinstance(reply["offset"], int)
    assert any("scoring worker consuming" in r["message"] for r in scoring)
    assert any(r["message"].strip().endswith("Worker ready") for r in features)
