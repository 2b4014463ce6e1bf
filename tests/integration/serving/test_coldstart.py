"""An item the version does not know but whose attributes are known is scored with its
cold-start vector (the learned new-item vector + the mean of its categories' embeddings), not
the OOV row; the served log marks it and rescoring the record reproduces the score."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis

from schemas import ItemEvent
from scoring.client import RankClient
from scoring.embeddings.cache import CachedEmbeddings
from scoring.embeddings.store import EmbeddingStore
from scoring.model.registry import load_scorer_from_redis
from scoring.serving.assemble import assemble, gather
from scoring.serving.served_log import rescore
from streamrank import clock
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from streams.items import ItemWriter
from tests.integration.serving.test_worker import worker_settings
from tests.integration.support.scoring import (
    item_ids,
    publish,
    read_topic,
    running_worker,
    write_sequence,
)

pytestmark = pytest.mark.timeout(120)


async def test_an_unknown_item_with_attributes_is_scored_with_its_cold_vector(
    make_settings: Callable[..., Settings],
    unique: str,
    redis: aioredis.Redis,
    tiny_artifacts: tuple[Path, Path],
) -> None:
    artifact = tiny_artifacts[0]
    version = await publish(redis, artifact)
    settings = worker_settings(
        make_settings, unique, STREAMRANK_CANARY_SPLIT=f"{version}:1",
        STREAMRANK_SERVED_LOG_TOPIC=f"served-{unique}",
    )  # fmt: skip
    await create_topics(settings)
    await create_topics(settings, topics=(f"served-{unique}",))
    known = item_ids(artifact)
    user, fresh, bare = f"u-{unique}", f"new-{unique}", f"bare-{unique}"
    now = clock.now_ms()
    history = [(f"{unique}-{k}", known[k], now - 10_000 + k) for k in range(5)]
    await write_sequence(redis, user, history)
    # the fresh item's genres: one in the vocabulary twice over, one not in it
    event = ItemEvent(fresh, "c1", now, {"genres": ("c3", "Sci-Fi")})
    assert await ItemWriter(redis=redis).apply([event]) == 1
    async with running_worker(settings), RankClient(settings=settings) as client:
        result = await client.rank(user, [known[9], fresh, bare], timeout=30)
    assert not result.degraded and result.model_version == version
    scorer, _ = await load_scorer_from_redis(redis, version)
    cold = scorer.cold_start
    assert cold is not None and cold.used(["c1", "c3", "Sci-Fi"]) == ["c1", "c3"]
    # the model applied to the cold vector, outside the worker
    hist_ids = [item for _, item, _ in history]
    batch = assemble([hist_ids], [[known[9], fresh, bare]], max_history=len(hist_ids))
    rows = await EmbeddingStore(redis=redis).lookup("item", batch.unique_ids, version=version)
    oov_rows = np.asarray(rows, dtype=np.float32)
    cold_rows = oov_rows.copy()
    cold_rows[batch.unique_ids.index(fresh)] = cold.vectors([["c1", "c3"]])[0]
    with_cold = scorer.score(*_inputs(cold_rows, batch))[0]
    with_oov = scorer.score(*_inputs(oov_rows, batch))[0]
    np.testing.assert_allclose(result.scores, with_cold, atol=1e-6)
    assert abs(with_cold[1] - with_oov[1]) > 1e-6  # not the OOV score
    assert result.scores[2] == pytest.approx(with_oov[2], abs=1e-6)  # no attributes: OOV
    [record] = await read_topic(settings, f"served-{unique}", want=1)
    assert record["cold_start"] == {fresh: ["c1", "c3"]}
    # today's attributes changed: rescoring still uses the categories logged
    await ItemWriter(redis=redis).apply([ItemEvent(fresh, "c4", now + 1)])
    embeddings = CachedEmbeddings(store=EmbeddingStore(redis=redis), cache_bytes=1 << 20)
    again = await rescore(record, scorer=scorer, embeddings=embeddings)
    np.testing.assert_allclose(again, result.scores, atol=1e-5)


def _inputs(rows: np.ndarray, batch) -> tuple[np.ndarray, ...]:  # type: ignore[no-untyped-def]
    hist, cands = gather(rows, batch)
    return hist, batch.hist_mask, cands, batch.cand_mask
