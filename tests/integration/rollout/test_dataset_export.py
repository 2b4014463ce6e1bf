"""Training data from what was served, through the real workers: a scoring worker logs what it
served, the outcomes worker closes each request's outcome, `dataset export` joins both topics;
every exported sample rescored with its version reproduces the logged scores (an item served
with its cold-start vector included), its labels are the clicks, redelivered and degraded
records are left out, and `train --from-dataset` with zero epochs from that version reproduces
it too."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from schemas import ClickEvent, ItemEvent
from scoring.client import RankClient
from scoring.model.artifact import load_artifact
from scoring.training.served_eval import ServedModel, rescore_samples
from streamrank import clock
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from streams.items import ItemWriter
from tests.integration.rollout.test_outcomes_worker import outcomes_worker
from tests.integration.support.scoring import (
    item_ids,
    publish,
    read_topic,
    running_worker,
    write_sequence,
)
from workbench.served_dataset import export_dataset, read_samples

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.standalone_only("online outcomes need a standalone or Sentinel Redis"),
]
USERS = 6


async def test_exported_samples_rescore_to_the_logged_scores(
    make_settings: Callable[..., Settings], unique: str, redis: aioredis.Redis,
    own_version: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    version = await publish(redis, own_version)
    settings = make_settings(
        STREAMRANK_SCORING_GROUP_ID=f"scoring-{unique}", STREAMRANK_OUTCOMES_GROUP_ID=f"outcomes-{unique}",
        STREAMRANK_SERVED_LOG_TOPIC=f"served-{unique}", STREAMRANK_OUTCOMES_TOPIC=f"outcomes-{unique}",
        STREAMRANK_CANARY_SPLIT=f"{version}:1", STREAMRANK_SCORING_BUDGET_MS=10_000,
        STREAMRANK_OUTCOME_BUCKET_S=1, STREAMRANK_OUTCOME_WINDOW_S=2, STREAMRANK_OUTCOME_CLOSE_DELAY_S=2,
    )  # fmt: skip
    await create_topics(settings)
    known = item_ids(own_version)
    fresh = f"fresh-{unique}"  # unknown to the version, with attributes: its cold vector
    event = ItemEvent(fresh, "c1", clock.now_ms(), {"genres": ("c3",)})
    assert await ItemWriter(redis=redis).apply([event]) == 1
    items = [*known[30:37], "never-trained", fresh]  # never-trained: no attributes, OOV row
    users = [f"ds-{unique}-{n}" for n in range(USERS)]
    for n, user in enumerate(users):
        await write_sequence(
            redis, user, [(f"h{n}-{k}", known[n + k], 1_000 + k) for k in range(n + 1)]
        )
    producer = AIOKafkaProducer(**settings.kafka.client_kwargs())
    await producer.start()
    clicked: dict[str, str] = {}
    try:
        async with (
            running_worker(settings), outcomes_worker(settings),
            RankClient(settings=settings) as client,
        ):  # fmt: skip
            results = [await client.rank(u, items, timeout=60) for u in users]
            for n, r in enumerate(results[::2]):  # every other user clicks one item
                clicked[r.request_id] = items[n + 1]
                click = ClickEvent(f"c{n}-{unique}", r.user_id, items[n + 1], ts=clock.now_ms())
                await producer.send_and_wait(settings.topics.clicks, click.to_json(),
                                             key=r.user_id.encode())  # fmt: skip
            outcomes = await read_topic(settings, str(settings.topics.outcomes), want=USERS,
                                        timeout_s=60)  # fmt: skip
            assert len(outcomes) == USERS
        # a redelivered record and a degraded one: neither becomes a sample
        served = await read_topic(settings, str(settings.topics.served_log), want=USERS)
        degraded = {**served[0], "request_id": f"deg-{unique}", "degraded": True}
        for record in (served[0], degraded):
            await producer.send_and_wait(str(settings.topics.served_log), orjson.dumps(record))
    finally:
        await producer.stop()
    out = tmp_path / "served.parquet"
    manifest = await export_dataset(settings, out, fmt="parquet", progress=False)
    assert manifest["rows"] == USERS and manifest["served_versions"] == [version]
    assert manifest["counts"]["duplicate"] == 1 and manifest["counts"]["degraded"] == 1
    samples = read_samples(out)
    assert all(s.cold_start == {fresh: ("c1", "c3")} for s in samples)
    by_id = {r.request_id: r for r in results}
    for s in samples:
        assert list(s.scores) == list(by_id[s.request_id].scores)
        want = clicked.get(s.request_id)
        assert [i for i, y in zip(s.items, s.labels, strict=True) if y] == ([want] if want else [])
    model = ServedModel.from_artifact(load_artifact(own_version))
    for got, s in zip(rescore_samples(model, samples), samples, strict=True):
        np.testing.assert_allclose(got, s.scores, atol=1e-4)
    # train --from-dataset, zero epochs from the serving version: the same scores
    from workbench.cli.main import main

    args = ["train", "--from-dataset", str(out), "--warm-start", str(own_version),
            "--epochs", "0", "--valid-share", "0.5", "--out", str(tmp_path / "models"),
            "--no-progress", "--json"]  # fmt: skip
    capsys.readouterr()
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["data"]["sha256"] == manifest["sha256"] and report["data"]["rows"] == USERS
    new = load_artifact(report["artifact"])
    assert new.config["data"]["served_versions"] == [version]
    again = rescore_samples(ServedModel.from_artifact(new), samples)
    for got, s in zip(again, samples, strict=True):
        np.testing.assert_allclose(got, s.scores, atol=1e-4)
