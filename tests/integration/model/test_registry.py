"""`streamrank publish` / `streamrank activate` and loading a scorer back, against the real Redis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from scoring.embeddings.codec import roundtrip
from scoring.embeddings.store import EmbeddingStore
from scoring.model.artifact import ITEMS_FILE, load_artifact
from scoring.model.registry import activate_version, load_scorer_from_redis, publish_artifact
from streamrank import keys
from streamrank.errors import ArtifactError, UnknownVersion
from streamrank.redis.client import client_for_url
from tests.conftest import StackInfo
from tests.unit.model.test_artifact import make_artifact
from workbench.cli.main import main

# A version's model and embedding keys lie in many slots; publish, delete and the leftover scan
# cross them: the cluster pass of `make test` runs this module too.
pytestmark = pytest.mark.cluster


def _run(url: str, fn: Any) -> Any:
    async def go() -> Any:
        client = client_for_url(url, decode_responses=False)
        try:
            return await fn(client)
        finally:
            await client.aclose()

    return asyncio.run(go())


async def _version_keys(client: Any, version: str) -> list[bytes]:
    found = [k async for k in client.scan_iter(match=f"sr:*{version}*", count=1000)]
    if version.encode() in await client.smembers(keys.embedding_versions()):
        found.append(b"(in sr:emb:versions)")
    return found


def test_publish_load_and_activate(
    stack: StackInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("STREAMRANK_REDIS_URL", stack.redis_url)
    path = make_artifact(tmp_path, rows=40)
    art = load_artifact(path)
    version = art.version

    # activating before publishing is refused, and leaves the pointer alone
    before = _run(stack.redis_url, lambda c: c.get(keys.active_model()))
    assert main(["activate", version]) == 1
    assert "not published" in capsys.readouterr().err
    assert _run(stack.redis_url, lambda c: c.get(keys.active_model())) == before

    assert main(["publish", str(path), "--encoding", "fp16", "--json", "--no-progress"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["version"] == version and report["encoding"] == "fp16"
    assert report["item_table"]["rows"] == 40

    async def check(client: Any) -> None:
        # dense + config in Redis; the config records the published encoding
        config = json.loads(await client.get(keys.model_config(version)))
        assert config["encoding"] == "fp16" and config["version"] == version
        assert await client.get(keys.model_dense(version)) == art.dense
        # item rows in the embedding store, as fp16
        store = EmbeddingStore(redis=client)
        rows = await store.lookup("item", ["item-3", "item-7", "nope"], version=version)
        np.testing.assert_array_equal(rows[:2], roundtrip(art.item_table[[3, 7]], "fp16"))
        np.testing.assert_array_equal(rows[2], roundtrip(art.oov_row[None], "fp16")[0])
        # a scorer loaded from Redis alone scores exactly like the artifact's
        scorer, cfg = await load_scorer_from_redis(client, version)
        assert cfg["model"] == art.config["model"]
        hist, cands = rows[None, :2], art.item_table[None, 10:15]
        m, cm = np.ones((1, 2), bool), np.ones((1, 5), bool)
        np.testing.assert_array_equal(
            scorer.score(hist, m, cands, cm), art.scorer().score(hist, m, cands, cm)
        )

    _run(stack.redis_url, check)

    assert main(["activate", version, "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["active"] == version
    assert _run(stack.redis_url, lambda c: c.get(keys.active_model())) == version.encode()

    # a second version: activate switches and reports the previous one
    other = load_artifact(make_artifact(tmp_path, rows=5, seed=1))
    _run(stack.redis_url, lambda c: publish_artifact(c, other, progress=False))
    previous = _run(stack.redis_url, lambda c: activate_version(c, other.version))
    assert previous == version
    # publishing the same version again is refused (versions are immutable)
    with pytest.raises(ArtifactError, match="already published"):
        _run(stack.redis_url, lambda c: publish_artifact(c, other, progress=False))

    # deleting the inactive version removes its model keys too: nothing of it is left to load
    assert main(["embeddings", "delete", version]) == 0
    capsys.readouterr()
    assert _run(stack.redis_url, lambda c: _version_keys(c, version)) == []
    with pytest.raises(UnknownVersion):
        _run(stack.redis_url, lambda c: load_scorer_from_redis(c, version))
    assert main(["activate", version]) == 1


@pytest.mark.parametrize("fault", ["missing items", "flipped byte", "wrong dims", "bad encoding"])
def test_bad_artifacts_publish_nothing(
    stack: StackInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fault: str,
) -> None:
    monkeypatch.setenv("STREAMRANK_REDIS_URL", stack.redis_url)
    path = make_artifact(tmp_path, rows=20)
    version = path.name
    argv = ["publish", str(path), "--no-progress"]
    if fault == "missing items":
        (path / ITEMS_FILE).unlink()
        message = "missing file items.safetensors"
    elif fault == "flipped byte":
        data = bytearray((path / ITEMS_FILE).read_bytes())
        data[100] ^= 0x01
        (path / ITEMS_FILE).write_bytes(bytes(data))
        message = "items.safetensors is corrupt"
    elif fault == "wrong dims":
        cfg = json.loads((path / "config.json").read_text())
        cfg["item_table"]["dim"] = 16
        (path / "config.json").write_text(json.dumps(cfg))
        message = "config.json says float32"
    else:
        argv += ["--encoding", "int4"]
        message = "unknown encoding 'int4'"
    assert main(argv) == 1
    assert message in capsys.readouterr().err
    assert _run(stack.redis_url, lambda c: _version_keys(c, version)) == []
    assert main(["activate", version]) == 1
    assert "not published" in capsys.readouterr().err


def test_publish_completes_after_a_crash_between_table_and_weights(
    stack: StackInfo, tmp_path: Path
) -> None:
    art = load_artifact(make_artifact(tmp_path, rows=12, encoding="int8"))

    async def scenario(client: Any) -> None:
        # the item table made it, the model keys did not (publish died in between)
        await EmbeddingStore(redis=client).publish(
            "item", art.item_ids, art.item_table, encoding="int8", version=art.version,
            oov_row=art.oov_row, progress=False,
        )  # fmt: skip
        with pytest.raises(UnknownVersion):
            await activate_version(client, art.version)  # not fully published yet
        with pytest.raises(UnknownVersion):
            await load_scorer_from_redis(client, art.version)
        # a different encoding than the stored table is a clear error, nothing written
        with pytest.raises(ArtifactError, match="already has an item table"):
            await publish_artifact(client, art, encoding="fp32", progress=False)
        assert await client.get(keys.model_config(art.version)) is None
        report = await publish_artifact(client, art, progress=False)
        assert report["item_table"]["resumed"] is True
        await activate_version(client, art.version)
        assert await client.get(keys.active_model()) == art.version.encode()

    _run(stack.redis_url, scenario)


@pytest.mark.parametrize("config", [b"{not json", b"[1, 2]"])
def test_corrupt_published_config_is_an_artifact_error(
    stack: StackInfo, unique: str, config: bytes
) -> None:
    # The scoring worker's reload catches StreamrankError: a bare JSONDecodeError (or an
    # AttributeError on a JSON list) would escape it.
    version = f"corrupt-{unique}"

    async def go(client: Any) -> None:
        await client.set(keys.model_config(version), config)
        await client.set(keys.model_dense(version), b"x")
        try:
            with pytest.raises(ArtifactError, match=f"config of model version '{version}'"):
                await load_scorer_from_redis(client, version)
            with pytest.raises(ArtifactError, match="delete the version"):
                await activate_version(client, version)
        finally:
            await client.delete(keys.model_config(version), keys.model_dense(version))

    _run(stack.redis_url, go)


def test_dense_weights_setting_reaches_the_workers_scorer(stack: StackInfo, tmp_path: Path) -> None:
    # STREAMRANK_SCORING_DENSE_WEIGHTS=int8: the scoring worker's loader builds an int8 scorer
    # from what is published, scoring exactly like the artifact's int8 scorer offline.
    from scoring.serving.metrics import ScoringMetrics
    from scoring.serving.wiring import real_dependencies

    art = load_artifact(make_artifact(tmp_path, rows=30, seed=3))
    rng = np.random.default_rng(0)
    hist = art.item_table[None, rng.integers(0, 30, 12)]  # [1, 12, d]
    cands = art.item_table[None, rng.integers(0, 30, 9)]  # [1, 9, d]
    m, cm = np.ones((1, 12), bool), np.ones((1, 9), bool)

    async def check(client: Any) -> None:
        await publish_artifact(client, art, progress=False)
        for dense in ("fp32", "int8"):
            settings = stack.settings(STREAMRANK_SCORING_DENSE_WEIGHTS=dense)
            _, _, loader = real_dependencies(settings, client, ScoringMetrics())
            scorer = await loader(art.version)
            assert scorer.dense == dense
            np.testing.assert_array_equal(
                scorer.score(hist, m, cands, cm),
                art.scorer(dense=dense).score(hist, m, cands, cm),
            )

    _run(stack.redis_url, check)


def test_a_version_the_workers_cannot_serve_is_refused(stack: StackInfo, tmp_path: Path) -> None:
    # Trained on 300 s buckets: activate and the worker's loader refuse it where the workers
    # count in 600 s buckets, naming the input; the pointer stays where it was.
    from scoring.model.features import FAMILIES
    from scoring.serving.metrics import ScoringMetrics
    from scoring.serving.wiring import real_dependencies
    from tests.integration.support.scoring import train_tiny_artifact

    art = load_artifact(train_tiny_artifact(tmp_path, seed=5, families=FAMILIES))
    other = stack.settings(STREAMRANK_COUNTER_BUCKET_S=600)

    async def check(client: Any) -> None:
        await publish_artifact(client, art, progress=False)
        before = await client.get(keys.active_model())
        with pytest.raises(ArtifactError, match="input 'counters' was trained on 1h windows"):
            await activate_version(client, art.version, features=other.features)
        assert await client.get(keys.active_model()) == before
        _, _, loader = real_dependencies(other, client, ScoringMetrics())
        with pytest.raises(ArtifactError, match="STREAMRANK_COUNTER_BUCKET_S"):
            await loader(art.version)
        _, _, same = real_dependencies(stack.settings(), client, ScoringMetrics())
        assert (await same(art.version)).features.counters  # where the windows match: served

    _run(stack.redis_url, check)
