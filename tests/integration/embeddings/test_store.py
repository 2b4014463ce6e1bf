"""The embedding store against the real Redis: round trips, OOV, versions, bad input, layout."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from redis.crc import key_slot

from scoring.embeddings.bucketing import bucket_of
from scoring.embeddings.codec import ENCODINGS, max_abs_error, roundtrip
from scoring.embeddings.store import EmbeddingStore
from scoring.model.registry import delete_version
from streamrank import keys
from streamrank.errors import EmbeddingError, UnknownVersion
from streamrank.redis.client import client_for_url, is_cluster
from tests.conftest import StackInfo
from tests.integration.support.embeddings import (
    RoundTrips,
    commandstats,
    config_set,
    config_value,
    matrix,
)

# Publishing configures every server, lookups run the fetch script once per slot group, listing
# and deleting a version scans every master: the cluster pass of `make test` runs this too.
pytestmark = pytest.mark.cluster


async def ziplist_value(redis: Any) -> int:
    return await config_value(redis, "hash-max-ziplist-value")


async def keys_of(redis: Any, version: str) -> list[bytes]:
    return [k async for k in redis.scan_iter(match=keys.embedding_version_pattern(version))]


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_round_trip_within_quantisation_bound(
    store: EmbeddingStore, redis: Any, unique: str, encoding: str
) -> None:
    ids = [f"item-{k}" for k in range(3000)]
    m = matrix(3000, 32, seed=1) * np.float32(3.0)
    m[17] = 0.0  # an all-zero row (int8 scale 0)
    version = f"rt-{encoding}-{unique}"
    report = await store.publish("item", ids, m, encoding=encoding, version=version, progress=False)
    assert report.rows == 3000 and report.dim == 32 and report.compact
    assert report.max_bucket_rows <= 128
    # Every bucket stays in the compact encoding (fp32 rows need hash-max-ziplist-value >= 128).
    for key in (await keys_of(redis, version))[:20]:
        if not key.endswith((b":meta", b":pid")):
            assert await redis.object("encoding", key) in (b"ziplist", b"listpack")
    asked = [*ids[::-1][:700], "item-17", "item-5", "item-5"]  # repeats allowed
    got = await store.lookup("item", asked, version=version)
    assert got.dtype == np.float32 and got.shape == (703, 32)
    idx = [int(i.split("-")[1]) for i in asked]
    err = np.abs(got - m[idx]).max(axis=1)
    assert np.all(err <= max_abs_error(m[idx], encoding))
    assert np.array_equal(got, roundtrip(m[idx], encoding))  # exactly what the codec produces
    assert np.array_equal(got[-1], got[-2])
    assert not got[700].any()  # item-17, the zero row
    meta = await store.table_meta(version, "item")
    assert (meta.dim, meta.encoding, meta.rows) == (32, encoding, 3000)
    assert meta.buckets == report.buckets


async def test_oov_rows_are_served_and_counted(store: EmbeddingStore, unique: str) -> None:
    ids = ["a", "b", "c"]
    m = matrix(3, 8, seed=2)
    v1, v2 = f"oov1-{unique}", f"oov2-{unique}"
    await store.publish("item", ids, m, encoding="fp32", version=v1, progress=False)
    oov = np.arange(8, dtype=np.float32)
    await store.publish("item", ids, m, encoding="fp16", version=v2, oov_row=oov, progress=False)
    before = store.oov_total
    got = await store.lookup("item", ["b", "zzz", "a", "zzz", "", "x\x1fy"], version=v1)
    assert np.array_equal(got[0], m[1]) and np.array_equal(got[2], m[0])
    assert not got[[1, 3, 4, 5]].any()  # default OOV row: zeros
    assert store.oov_total - before == 4  # per requested occurrence
    got2 = await store.lookup("item", ["nope", "c"], version=v2)
    assert np.array_equal(got2[0], oov)
    assert np.allclose(got2[1], m[2], atol=float(max_abs_error(m[2:3], "fp16")[0]))
    assert (await store.lookup("item", [], version=v1)).shape == (0, 8)


async def test_versions_are_isolated_and_delete_removes_only_one(
    store: EmbeddingStore, redis: Any, unique: str
) -> None:
    ids = [f"i{k}" for k in range(500)]
    a, b = matrix(500, 16, seed=3), matrix(500, 16, seed=4)
    va, vb = f"iso-a-{unique}", f"iso-b-{unique}"
    await store.publish("item", ids, a, encoding="fp32", version=va, progress=False)
    before_a = await store.lookup("item", ids, version=va)
    await store.publish("item", ids, b, encoding="fp32", version=vb, progress=False)
    await store.publish("user", ids[:10], b[:10], encoding="int8", version=vb, progress=False)
    assert np.array_equal(await store.lookup("item", ids, version=va), before_a)
    assert np.array_equal(await store.lookup("item", ids, version=vb), b)
    assert {va, vb} <= set(await store.versions())
    # Published versions are immutable.
    with pytest.raises(EmbeddingError, match="already published"):
        await store.publish("item", ids, b, encoding="fp32", version=va, progress=False)
    n_keys_b = len(await keys_of(redis, vb))
    deleted = await delete_version(store, vb)
    assert deleted == n_keys_b > 2
    assert await keys_of(redis, vb) == []
    assert vb not in await store.versions()
    assert np.array_equal(await store.lookup("item", ids, version=va), before_a)
    with pytest.raises(UnknownVersion, match=vb):
        await store.lookup("item", ids[:3], version=vb)
    with pytest.raises(UnknownVersion):
        await delete_version(store, vb)


async def test_delete_refuses_the_active_model_version(
    store: EmbeddingStore, redis: Any, unique: str
) -> None:
    version = f"active-{unique}"
    await store.publish(
        "item", ["a"], matrix(1, 4, 5), encoding="int8", version=version, progress=False
    )
    previous = await redis.get(keys.active_model())
    await redis.set(keys.active_model(), version)
    try:
        with pytest.raises(EmbeddingError, match="active model version"):
            await delete_version(store, version)
        assert version in await store.versions()
        assert await delete_version(store, version, force=True) >= 2
    finally:
        if previous is None:
            await redis.delete(keys.active_model())
        else:
            await redis.set(keys.active_model(), previous)


async def test_delete_refuses_a_version_in_the_canary_split(
    store: EmbeddingStore, redis: Any, unique: str
) -> None:
    # The scoring worker serves every version of sr:model:split, not only sr:model:active.
    version, other = f"canary-{unique}", f"other-{unique}"
    for v in (version, other):
        await store.publish(
            "item", ["a"], matrix(1, 4, 5), encoding="int8", version=v, progress=False
        )
    previous = await redis.get(keys.model_split())
    await redis.set(keys.model_split(), f"din-main-{unique}:0.9, {version}:0.1")
    try:
        with pytest.raises(EmbeddingError, match=f"{version!r} is in the canary split"):
            await delete_version(store, version)
        assert version in await store.versions()
        assert await delete_version(store, other) >= 2  # not in the split
        assert await delete_version(store, version, force=True) >= 2
    finally:
        if previous is None:
            await redis.delete(keys.model_split())
        else:
            await redis.set(keys.model_split(), previous)


async def test_deleted_and_republished_version_is_reread(redis: Any, unique: str) -> None:
    # Two processes: the reader caches the meta, the writer deletes and republishes.
    reader, writer = EmbeddingStore(redis=redis), EmbeddingStore(redis=redis)
    version = f"repub-{unique}"
    ids = [f"i{k}" for k in range(300)]
    first, second = matrix(300, 8, seed=6), matrix(250, 8, seed=7)
    await writer.publish("item", ids, first, encoding="fp32", version=version, progress=False)
    assert np.array_equal(await reader.lookup("item", ids[:5], version=version), first[:5])
    await delete_version(writer, version)
    with pytest.raises(UnknownVersion):
        await reader.lookup("item", ids[:5], version=version)
    await writer.publish(
        "item", ids[:250], second, encoding="fp32", version=version, progress=False
    )
    got = await reader.lookup("item", ids[:5] + ids[260:261], version=version)
    assert np.array_equal(got[:5], second[:5])
    assert not got[5].any()  # not in the new publish: OOV, never the old row
    await delete_version(writer, version)


async def test_bad_input_is_rejected_before_anything_is_written(
    store: EmbeddingStore, redis: Any, unique: str
) -> None:
    version = f"bad-{unique}"
    ids = [f"i{k}" for k in range(10)]
    good = matrix(10, 4, seed=8)
    nan = good.copy()
    nan[2, 0] = np.nan
    nan[6, 3] = -np.inf
    cases = [
        (dict(ids=ids, matrix=nan), r"NaN or Inf.*'i2', 'i6'"),
        (dict(ids=[*ids[:9], "i0"], matrix=good), r"unique.*'i0'"),
        (dict(ids=ids, matrix=good, dim=8), "dim is 4, expected 8"),
        (dict(ids=ids[:9], matrix=good), "10 rows but 9 ids"),
        (dict(ids=ids, matrix=good.astype(np.int32)), "dtype is int32"),
        (dict(ids=ids, matrix=good, oov_row=[1.0]), "oov_row"),
        (dict(ids=[], matrix=good[:0]), "no rows to publish"),
    ]
    for kwargs, message in cases:
        with pytest.raises(EmbeddingError, match=message):
            await store.publish("item", encoding="int8", version=version, progress=False, **kwargs)
    with pytest.raises(EmbeddingError, match="invalid table name"):
        await store.publish("it:em", ids, good, encoding="int8", version=version, progress=False)
    with pytest.raises(EmbeddingError, match="unknown encoding"):
        await store.publish("item", ids, good, encoding="int4", version=version, progress=False)
    with pytest.raises(EmbeddingError, match="oov_row exceeds the fp16 range"):
        await store.publish(
            "item", ids, good, encoding="fp16", version=version, oov_row=[1e5] * 4, progress=False
        )
    assert await keys_of(redis, version) == []
    assert version not in await store.versions()


async def test_unknown_version_and_table_errors(store: EmbeddingStore, unique: str) -> None:
    with pytest.raises(UnknownVersion, match=f"'nope-{unique}' is not published"):
        await store.lookup("item", ["a"], version=f"nope-{unique}")
    version = f"known-{unique}"
    await store.publish(
        "item", ["a"], matrix(1, 4, 9), encoding="int8", version=version, progress=False
    )
    with pytest.raises(UnknownVersion, match="has no table 'user'"):
        await store.table_meta(version, "user")


@pytest.mark.parametrize("fetch_mode", ["script", "pipeline"])
async def test_one_round_trip_per_batch(redis: Any, unique: str, fetch_mode: str) -> None:
    store = EmbeddingStore(redis=redis, fetch_mode=fetch_mode)  # type: ignore[arg-type]
    version = f"rtt-{fetch_mode}-{unique}"
    ids = [str(k) for k in range(20_000)]
    m = matrix(20_000, 32, seed=10)
    report = await store.publish("item", ids, m, encoding="int8", version=version, progress=False)
    assert report.buckets > 150  # so a 150-id batch touches many buckets
    meta = await store.table_meta(version, "item")  # meta read once per process, then cached
    assert meta.shards == 16
    rng = np.random.default_rng(11)
    for _ in range(3):
        asked = [str(k) for k in rng.integers(0, 25_000, 150)]  # some unknown
        # One script call per slot the touched shards are in: on one server, one per batch.
        shards = set(keys.embedding_shard(bucket_of(list(dict.fromkeys(asked)), meta.buckets), 16))
        tags = [keys.embedding_shard_tag(version, "item", int(s)) for s in shards]
        calls = len({key_slot(t.encode()) for t in tags}) if is_cluster(redis) else 1
        stats = await commandstats(redis)
        trips = RoundTrips.count
        got = await store.lookup("item", asked, version=version)
        assert RoundTrips.count - trips == 1  # one pipeline (every node at once on a cluster)
        after = await commandstats(redis)
        if fetch_mode == "script":
            # The whole batch ran inside one EVALSHA per slot group on the server.
            assert after.get("evalsha", 0) - stats.get("evalsha", 0) == calls
            assert after.get("hmget", 0) == stats.get("hmget", 0)
        idx = np.array([int(a) for a in asked])
        known = idx < 20_000
        assert np.array_equal(got[known], roundtrip(m[idx[known]], "int8"))
        assert not got[~known].any()
    await delete_version(store, version)


async def test_a_zero_ziplist_entries_limit_is_a_clear_error(redis: Any, unique: str) -> None:
    original = await config_value(redis, "hash-max-ziplist-entries")
    await config_set(redis, "hash-max-ziplist-entries", 0)
    try:
        store = EmbeddingStore(redis=redis)
        with pytest.raises(EmbeddingError, match="hash-max-ziplist-entries 0"):
            await store.publish(
                "item", ["a"], matrix(1, 8, 1), encoding="int8", version=f"ze-{unique}",
                progress=False,
            )  # fmt: skip
        assert await keys_of(redis, f"ze-{unique}") == []
    finally:
        await config_set(redis, "hash-max-ziplist-entries", original)


async def test_fp32_needs_a_larger_ziplist_value_limit(redis: Any, unique: str) -> None:
    original = await ziplist_value(redis)
    await config_set(redis, "hash-max-ziplist-value", 64)
    try:
        strict = EmbeddingStore(redis=redis, configure_redis=False)
        with pytest.raises(EmbeddingError, match="hash-max-ziplist-value >= 128"):
            await strict.publish(
                "item",
                ["a"],
                matrix(1, 32, 12),
                encoding="fp32",
                version=f"z-{unique}",
                progress=False,
            )
        # fp16 at dim 32 is exactly 64 bytes: fits the default limit.
        ok = await strict.publish(
            "item", ["a"], matrix(1, 32, 12), encoding="fp16", version=f"z-{unique}", progress=False
        )
        assert ok.compact
        lenient = EmbeddingStore(redis=redis, configure_redis=True)
        report = await lenient.publish(
            "item",
            ["a", "b"],
            matrix(2, 32, 12),
            encoding="fp32",
            version=f"z2-{unique}",
            progress=False,
        )
        assert report.compact
        assert await ziplist_value(redis) == 128
        await delete_version(lenient, f"z-{unique}")
        await delete_version(lenient, f"z2-{unique}")
    finally:
        await config_set(redis, "hash-max-ziplist-value", max(original, 128))


async def test_client_must_return_bytes(stack: StackInfo) -> None:
    from streamrank.errors import ConfigError

    text = client_for_url(stack.redis_url, decode_responses=True)
    with pytest.raises(ConfigError, match="decode_responses=False"):
        EmbeddingStore(redis=text)
    await text.aclose()


@pytest.mark.parametrize("fetch_mode", ["script", "pipeline"])
async def test_unicode_ids_round_trip(redis: Any, unique: str, fetch_mode: str) -> None:
    # Ids travel as UTF-8 (bucket hash, HSET field, the script's \x1f-joined argument).
    store = EmbeddingStore(redis=redis, fetch_mode=fetch_mode)  # type: ignore[arg-type]
    version = f"uni-{fetch_mode}-{unique}"
    ids = ["café", "東京", "🎬-42", "a,b", "naïve ", "ß" * 40, *(f"é{k}" for k in range(200))]
    m = matrix(len(ids), 16, seed=12)
    await store.publish("item", ids, m, encoding="fp16", version=version, progress=False)
    asked = ["🎬-42", "cafe", "東京", "café", "a,b", "ß" * 40, "é199", "東京", "naïve"]
    got = await store.lookup("item", asked, version=version)
    expected = roundtrip(m, "fp16")
    for k, i in enumerate(asked):
        if i in ids:
            assert np.array_equal(got[k], expected[ids.index(i)]), i
        else:
            assert not got[k].any(), i  # "cafe" and "naïve" (no trailing space) are unknown
    await delete_version(store, version)
