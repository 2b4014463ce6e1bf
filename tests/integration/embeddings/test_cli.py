"""`streamrank embeddings versions|info|delete` against the real Redis."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from scoring.embeddings.store import EmbeddingStore
from tests.conftest import StackInfo
from tests.integration.support.embeddings import matrix
from workbench.cli.main import main

# `embeddings versions|delete` scan every master of a cluster: the cluster pass runs this too.
pytestmark = pytest.mark.cluster


async def _publish(url: str, version: str) -> None:
    async with EmbeddingStore.from_url(url) as store:
        ids = [f"i{k}" for k in range(300)]
        await store.publish(
            "item", ids, matrix(300, 8, 1), encoding="int8", version=version, progress=False
        )


def test_versions_info_delete(
    stack: StackInfo,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("STREAMRANK_REDIS_URL", stack.redis_url)
    version = f"cli-{unique}"
    asyncio.run(_publish(stack.redis_url, version))

    assert main(["embeddings", "versions", "--json"]) == 0
    assert version in orjson.loads(capsys.readouterr().out)["versions"]

    assert main(["embeddings", "info", version, "--json"]) == 0
    (info,) = orjson.loads(capsys.readouterr().out)
    assert (info["version"], info["table"], info["rows"], info["dim"]) == (version, "item", 300, 8)
    assert info["encoding"] == "int8" and info["row_bytes"] == 12

    assert main(["embeddings", "delete", version, "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["version"] == version and out["keys_deleted"] >= 2

    assert main(["embeddings", "versions", "--json"]) == 0
    assert version not in orjson.loads(capsys.readouterr().out)["versions"]

    # Unknown version: a clear error and exit code 1.
    assert main(["embeddings", "delete", version]) == 1
    assert "is not published" in capsys.readouterr().err
    assert main(["embeddings", "info", version]) == 1
    assert "not published" in capsys.readouterr().err
