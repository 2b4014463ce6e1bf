"""The overlay against the real Redis: upserted rows win over the base in the same fetch, the
cache drops rows (and cached unknown ids) once an upsert is visible, delete and republish clear
the overlay, and bad rows are refused before anything is written."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from scoring.embeddings.cache import CachedEmbeddings
from scoring.embeddings.codec import roundtrip
from scoring.embeddings.store import EmbeddingStore
from scoring.model.registry import delete_version
from streamrank import keys
from streamrank.errors import EmbeddingError, UnknownVersion
from tests.integration.support.embeddings import matrix

# Overlay-then-base is one script call per slot: the cluster pass of `make test` runs this too.
pytestmark = pytest.mark.cluster

IDS = [f"o{k}" for k in range(400)]
DIM = 8


async def _publish(store: EmbeddingStore, version: str, encoding: str = "int8") -> np.ndarray:
    base = matrix(len(IDS), DIM, 1)
    await store.publish("item", IDS, base, encoding=encoding, version=version, progress=False)
    return base


async def _overlay_keys(store: EmbeddingStore, version: str) -> int:
    """How many overlay keys (rows and overlay-id copies) of the item table exist."""
    found = 0
    for shard in range(16):
        for key in (
            keys.embedding_overlay(version, "item", shard),
            keys.embedding_overlay_id(version, "item", shard),
        ):
            found += int(await store.redis.exists(key))
    return found


@pytest.mark.parametrize("mode", ["script", "pipeline"])
async def test_upsert_is_visible_to_the_next_fetch(redis: object, unique: str, mode: str) -> None:
    store = EmbeddingStore(redis=redis, fetch_mode=mode)  # type: ignore[arg-type]
    version = f"ov-{unique}"
    base = await _publish(store, version)
    try:
        new = matrix(3, DIM, 9)
        ids = ["o5", "o77", "fresh-1"]  # two changed, one new
        asked = ["o5", "o6", "o77", "fresh-1", "nope"]
        before = await store.fetch_encoded("item", asked, version=version)
        assert before.overlay_id == "" and before.overlay is None
        report = await store.upsert("item", ids, new, version=version)
        assert (report.rows, report.new_rows, report.overlay_id) == (3, 3, "000000000001")
        rows = await store.fetch_encoded("item", asked, version=version)
        assert rows.overlay_id == "000000000001"
        assert rows.found.tolist() == [True, True, True, True, False]
        assert rows.overlay is not None and rows.overlay.tolist() == [1, 0, 1, 1, 0]
        got = rows.decode()
        want = roundtrip(np.stack([new[0], base[6], new[1], new[2]]), "int8")
        np.testing.assert_array_equal(got[:4], want)
        # An upsert of the same ids again: a new id, no new rows.
        again = await store.upsert("item", ids[:1], new[:1] * 2, version=version)
        assert (again.new_rows, again.overlay_id) == (0, "000000000002")
        assert await store.overlay_info(version, "item") == {
            "overlay_id": "000000000002",
            "overlay_rows": 3,
        }
        looked = await store.lookup("item", ["o5"], version=version)
        np.testing.assert_array_equal(looked, roundtrip(new[:1] * 2, "int8"))
    finally:
        await delete_version(store, version, force=True)


async def test_cache_drops_replaced_rows_and_unknown_ids_gain_a_row(
    store: EmbeddingStore, unique: str
) -> None:
    version = f"ovc-{unique}"
    base = await _publish(store, version, encoding="fp16")
    registry = CollectorRegistry()
    emb = CachedEmbeddings(store=store, cache_bytes=1 << 20, registry=registry, overlay_check_ms=0)
    batch = ["o1", "o2", "new-9"]
    first = await emb.lookup(version, "item", batch)
    np.testing.assert_array_equal(first[2], np.zeros(DIM, dtype=np.float32))  # OOV
    await emb.lookup(version, "item", batch)
    assert emb.stats()["hits"] == 3  # the whole batch is cached, unknown id included
    new = matrix(2, DIM, 5)
    await store.upsert("item", ["o2", "new-9"], new, version=version)
    # Served from the cache alone, yet the next lookup sees the upsert (overlay_check_ms=0).
    after = await emb.lookup(version, "item", batch)
    np.testing.assert_array_equal(after[0], roundtrip(base[1:2], "fp16")[0])
    np.testing.assert_array_equal(after[1:], roundtrip(new, "fp16"))
    assert registry.get_sample_value("streamrank_embedding_overlay_rows_total") == 2
    # A batch with misses learns a newer upsert from its fetch and re-reads its hits.
    newer = matrix(1, DIM, 6)
    await store.upsert("item", ["o1"], newer, version=version)
    mixed = await emb.lookup(version, "item", ["o1", "o2", "o3"])
    np.testing.assert_array_equal(mixed[0], roundtrip(newer, "fp16")[0])
    np.testing.assert_array_equal(mixed[2], roundtrip(base[3:4], "fp16")[0])
    await delete_version(store, version, force=True)


async def test_cache_learns_an_upsert_within_the_check_interval(
    store: EmbeddingStore, unique: str
) -> None:
    version = f"ovi-{unique}"
    await _publish(store, version)
    emb = CachedEmbeddings(store=store, cache_bytes=1 << 20, overlay_check_ms=300)
    await emb.lookup(version, "item", ["o1"])
    await store.upsert("item", ["o1"], matrix(1, DIM, 3), version=version)
    stale = await emb.lookup(version, "item", ["o1"])  # cached, checked less than 300 ms ago
    fresh_emb = CachedEmbeddings(store=store, cache_bytes=1 << 20)
    fresh = await fresh_emb.lookup(version, "item", ["o1"])
    assert not np.array_equal(stale, fresh)
    await asyncio.sleep(0.35)  # the interval passed: the next cache-only batch re-reads it
    np.testing.assert_array_equal(await emb.lookup(version, "item", ["o1"]), fresh)
    await delete_version(store, version, force=True)


async def test_delete_removes_the_overlay_and_a_republish_starts_without_one(
    store: EmbeddingStore, unique: str
) -> None:
    version = f"ovd-{unique}"
    await _publish(store, version)
    await store.upsert("item", ["o1", "extra"], matrix(2, DIM, 4), version=version)
    assert await _overlay_keys(store, version) > 0
    await delete_version(store, version, force=True)
    assert await _overlay_keys(store, version) == 0
    base = await _publish(store, version)
    rows = await store.fetch_encoded("item", ["o1", "extra"], version=version)
    assert rows.overlay_id == "" and rows.found.tolist() == [True, False]
    np.testing.assert_array_equal(rows.decode()[0], roundtrip(base[1:2], "int8")[0])
    assert await store.overlay_info(version, "item") == {"overlay_id": "", "overlay_rows": 0}


async def test_bad_rows_are_refused_before_anything_is_written(
    store: EmbeddingStore, unique: str
) -> None:
    version = f"ovb-{unique}"
    await _publish(store, version)
    bad_dim = matrix(2, DIM + 1, 1)
    with pytest.raises(EmbeddingError, match=f"matrix dim is {DIM + 1}, expected {DIM}"):
        await store.upsert("item", ["a", "b"], bad_dim, version=version)
    nan = matrix(2, DIM, 1)
    nan[1, 3] = np.nan
    with pytest.raises(EmbeddingError, match=r"NaN or Inf.*'b'"):
        await store.upsert("item", ["a", "b"], nan, version=version)
    with pytest.raises(EmbeddingError, match="unique"):
        await store.upsert("item", ["a", "a"], matrix(2, DIM, 1), version=version)
    with pytest.raises(UnknownVersion):
        await store.upsert("item", ["a"], matrix(1, DIM, 1), version=f"none-{unique}")
    assert await store.overlay_info(version, "item") == {"overlay_id": "", "overlay_rows": 0}
    assert await _overlay_keys(store, version) == 0
    await delete_version(store, version, force=True)
