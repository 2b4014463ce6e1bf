"""Publishing a version's retrieval model and index to the real Redis (in chunks, config last),
loading the worker's retriever back, and a missing or corrupt chunk leaving the version served
without a retriever."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from scoring.model import registry
from scoring.model.artifact import load_artifact
from scoring.model.registry import delete_version, load_retriever_from_redis, publish_artifact
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.watcher import VersionWatcher
from scoring.serving.wiring import real_retriever_loader
from streamrank import keys
from streamrank.errors import ArtifactError
from streamrank.redis.client import client_for_url
from tests.conftest import StackInfo
from tests.integration.serving.test_watcher_stop import NoEmbeddings
from tests.unit.model.test_artifact_retrieval import make_artifact
from tests.unit.model.test_retrieval import HISTORIES

pytestmark = pytest.mark.cluster  # chunks, config and dense share the version's slot


def _run(url: str, fn: Any) -> Any:
    async def go() -> Any:
        client = client_for_url(url, decode_responses=False)
        try:
            return await fn(client)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_publish_then_load_the_retriever(
    stack: StackInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "CHUNK_BYTES", 1024)  # several chunks even for a tiny index
    art = load_artifact(make_artifact(tmp_path, rows=60))
    assert art.retrieval is not None
    offline = art.retriever()
    version = art.version

    async def check(client: Any) -> None:
        report = await publish_artifact(client, art, progress=False)
        chunks = report["retrieval"]["chunks"]
        assert chunks["index"] == -(-len(art.retrieval.index) // 1024) > 1  # type: ignore[union-attr]
        config = json.loads(await client.get(keys.model_config(version)))
        assert config["retrieval"]["chunks"] == chunks
        online = await load_retriever_from_redis(client, version, config)
        assert online is not None and online.item_ids == offline.item_ids
        users = online.user_vectors(HISTORIES)
        np.testing.assert_array_equal(users, offline.user_vectors(HISTORIES))
        np.testing.assert_array_equal(online.search(users, 7)[0], offline.search(users, 7)[0])
        assert online.categories == offline.categories

        # the worker's watcher serves it with its retriever
        metrics = ScoringMetrics(CollectorRegistry())
        watcher = VersionWatcher(redis=client, loader=lambda v: v, embeddings=NoEmbeddings(),
                                 metrics=metrics, static_split=f"{version}:1",
                                 retriever_loader=real_retriever_loader(client))  # fmt: skip
        assert await watcher.refresh()
        assert watcher.current is not None and set(watcher.current.retrievers) == {version}

        # a corrupt chunk, then a missing one: served without a retriever, counted
        await client.set(keys.index_chunk(version, 1), b"x" * 1024)
        with pytest.raises(ArtifactError, match=r"index chunks .* are corrupt"):
            await load_retriever_from_redis(client, version, config)
        await client.delete(keys.index_chunk(version, 1))
        with pytest.raises(ArtifactError, match=r"index:1 is missing in Redis; delete the version"):
            await load_retriever_from_redis(client, version, config)
        again = VersionWatcher(redis=client, loader=lambda v: v, embeddings=NoEmbeddings(),
                               metrics=metrics, static_split=f"{version}:1",
                               retriever_loader=real_retriever_loader(client))  # fmt: skip
        assert await again.refresh()
        assert again.current is not None and set(again.current.scorers) == {version}
        assert dict(again.current.retrievers) == {}
        assert metrics.retrieval_unavailable.labels("load_failed")._value.get() == 1

        # deleting the version removes every chunk
        from scoring.embeddings.store import EmbeddingStore

        await delete_version(EmbeddingStore(redis=client), version, force=True)
        left = [k async for k in client.scan_iter(match=f"sr:{{model:{version}}}*")]
        assert left == []

    _run(stack.redis_url, check)
