"""Fixtures shared by the integration tests (the stack itself is in tests/conftest.py): a
Redis client on the stack, an embedding store on it that cleans up what it published, and two
really trained tiny DIN artifacts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scoring.embeddings.store import EmbeddingStore
from scoring.model.registry import delete_version
from tests.conftest import StackInfo
from tests.integration.support.embeddings import counting_client
from tests.integration.support.scoring import train_tiny_artifact


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
async def redis(stack: StackInfo) -> AsyncIterator[Any]:
    """A client (bytes replies) on the stack's Redis (a cluster client on a cluster) that
    counts its round trips."""
    client = counting_client(stack.redis_url, decode_responses=False)
    yield client
    await client.aclose()


@pytest.fixture
async def store(redis: Any) -> AsyncIterator[EmbeddingStore]:
    """An embedding store on :func:`redis`; every version published through it is deleted at
    the end of the test."""
    s = EmbeddingStore(redis=redis)
    published: list[str] = []
    original = s.publish

    async def tracking_publish(*args: Any, **kwargs: Any) -> Any:
        published.append(kwargs["version"])
        return await original(*args, **kwargs)

    s.publish = tracking_publish  # type: ignore[method-assign]
    yield s
    for version in set(published):
        if version in await s.versions():
            await delete_version(s, version, force=True)


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny DINs, really trained (one epoch on synthetic clicks, seconds on a CPU)."""
    out = tmp_path_factory.mktemp("tiny-models")
    return train_tiny_artifact(out, seed=3), train_tiny_artifact(out, seed=4)
