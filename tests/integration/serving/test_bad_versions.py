"""Fault 8: a model version that cannot serve (corrupt dense weights, weights that do not
match the config's dims, NaN weights) is refused with a clear error while the scoring worker
keeps serving the previous version; a good version after it is taken up as usual."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from scoring.client import RankClient
from scoring.model.din import TABLE_PREFIX
from streamrank import keys
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from tests.integration.support.scoring import item_ids, publish, running_worker, wait_for
from workbench.devstack.servers import private_redis

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.standalone_only(
        "starts its own standalone redis-server (the cluster pass would repeat it)"
    ),
]


async def plant(
    client: aioredis.Redis, good: str, bad: str, *, dense: bytes, model: dict | None = None
) -> None:
    """A version ``bad`` published like ``good`` (same item table rows) but with ``dense``
    weights and, optionally, another ``model`` section in its config."""
    config = json.loads(await client.get(keys.model_config(good)))
    config["version"] = bad
    if model is not None:
        config["model"] = {**config["model"], **model}
    await client.set(keys.model_dense(bad), dense)
    await client.set(keys.model_config(bad), json.dumps(config))


async def test_unusable_versions_are_refused_and_the_previous_keeps_serving(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path], caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.ERROR, logger="scoring.serving.watcher")
    with private_redis(tmp_path) as server:
        settings = make_settings(STREAMRANK_REDIS_URL=server.url, STREAMRANK_SCORING_GROUP_ID=f"scoring-{unique}",
                                 STREAMRANK_SCORING_POLL_S=0.1, STREAMRANK_SCORING_BUDGET_MS=10_000)  # fmt: skip
        await create_topics(settings)
        client = aioredis.from_url(server.url)
        good = await publish(client, tiny_artifacts[0])
        other = await publish(client, tiny_artifacts[1])
        await client.set(keys.active_model(), good)
        dense = await client.get(keys.model_dense(good))
        tensors = st_load(dense)
        # A weight of the net (the small tables under tables. are not used to serve); sorted,
        # since the order safetensors gives back varies between processes.
        name = min(k for k in tensors if not k.startswith(TABLE_PREFIX))
        nan = dict(tensors)
        nan[name] = torch.full_like(tensors[name], float("nan"))
        cases = {
            "din-20990101-corrup": (b"\x00not safetensors" * 10, None,
                                    "dense weights are not a valid safetensors file"),
            "din-20990101-dimsxx": (dense, {"attention_hidden": [16, 8]},
                                    "dense weights do not match the config's model dims"),
            "din-20990101-nanxxx": (st_save(nan), None, "dense weights hold NaN/Inf"),
        }  # fmt: skip
        items = item_ids(tiny_artifacts[0])[:5]
        async with running_worker(settings) as worker, RankClient(settings=settings) as rank:
            assert (await rank.rank("u1", items, timeout=30)).model_version == good
            for bad, (weights, model, message) in cases.items():
                await plant(client, good, bad, dense=weights, model=model)
                await client.set(keys.active_model(), bad)
                await wait_for(lambda m=message: m in caplog.text, timeout_s=20,
                               what=f"the refusal of {bad}")  # fmt: skip
                assert f"cannot switch to (('{bad}', 1.0),)" in caplog.text
                assert f"still serving {good}:1" in caplog.text
                result = await rank.rank("u1", items, timeout=30)
                assert result.model_version == good and not result.degraded
            # A good version after the bad ones is served as usual.
            await client.set(keys.active_model(), other)
            await wait_for(lambda: worker.watcher is not None and
                           worker.watcher.describe() == f"{other}:1", timeout_s=20,
                           what="the good version")  # fmt: skip
            assert (await rank.rank("u1", items, timeout=30)).model_version == other
        await client.aclose()
