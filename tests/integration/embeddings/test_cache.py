"""The local cache in front of the real Redis store: accounting, round trips, versions, warm-up."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from scoring.embeddings.cache import ENTRY_OVERHEAD_BYTES, CachedEmbeddings
from scoring.embeddings.codec import roundtrip
from scoring.embeddings.store import EmbeddingStore
from scoring.model.registry import delete_version
from tests.conftest import StackInfo
from tests.integration.support.embeddings import RoundTrips, counting_client, matrix

# The cache's misses are one fetch pipeline over every node that holds them: the cluster pass of
# `make test` runs this module too.
pytestmark = pytest.mark.cluster

IDS = [f"m{k}" for k in range(2000)]


@pytest.fixture
async def two_versions(store: EmbeddingStore, unique: str) -> AsyncIterator[tuple[str, str]]:
    va, vb = f"ca-{unique}", f"cb-{unique}"
    await store.publish(
        "item", IDS, matrix(2000, 32, 1), encoding="int8", version=va, progress=False
    )
    await store.publish(
        "item", IDS, matrix(2000, 32, 2), encoding="fp16", version=vb, progress=False
    )
    yield va, vb
    await delete_version(store, va)
    await delete_version(store, vb)


def sample(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None, name
    return value


@pytest.mark.parametrize("hold", ["encoded", "decoded"])
@pytest.mark.parametrize("policy", ["tinylfu", "lru"])
async def test_values_hits_misses_and_one_round_trip(
    store: EmbeddingStore, two_versions: tuple[str, str], hold: str, policy: str
) -> None:
    va, _ = two_versions
    registry = CollectorRegistry()
    emb = CachedEmbeddings(
        store=store,
        cache_bytes=1 << 20,
        policy=policy,
        registry=registry,
        hold=hold,  # type: ignore[arg-type]
    )
    expected = roundtrip(matrix(2000, 32, 1), "int8")
    await store.fetch_encoded("item", ["m0"], version=two_versions[1])  # loads the Lua script
    asked = ["m5", "m9", "m5", "nope", "m1999"]
    trips = RoundTrips.count
    got = await emb.lookup(va, "item", asked)
    assert RoundTrips.count - trips == 2  # meta (first use of the table) + 1 fetch
    assert np.array_equal(got[[0, 1, 2, 4]], expected[[5, 9, 5, 1999]])
    assert not got[3].any()
    s = emb.stats()
    assert (s["hits"], s["misses"], s["oov"]) == (0, 4, 1)
    # Second time: everything from the cache, no round trip at all.
    trips = RoundTrips.count
    again = await emb.lookup(va, "item", asked)
    assert RoundTrips.count == trips
    assert np.array_equal(again, got)
    # A mixed batch: misses fetched in ONE round trip.
    trips = RoundTrips.count
    mixed = await emb.lookup(va, "item", ["m5", "m10", "m11", "m12", "m9"])
    assert RoundTrips.count - trips == 1
    assert np.array_equal(mixed, expected[[5, 10, 11, 12, 9]])
    s = emb.stats()
    assert (s["hits"], s["misses"], s["oov"]) == (4 + 2, 4 + 3, 2)
    assert s["hit_ratio"] == pytest.approx(6 / 13)
    row = 36 if hold == "encoded" else 128
    assert s["entries"] == 7 and s["bytes"] == 7 * (row + ENTRY_OVERHEAD_BYTES)
    assert sample(registry, "streamrank_embedding_cache_hits_total") == 6
    assert sample(registry, "streamrank_embedding_cache_misses_total") == 7
    assert sample(registry, "streamrank_embedding_oov_total") == 2
    assert sample(registry, "streamrank_embedding_cache_hit_ratio") == pytest.approx(6 / 13)
    assert sample(registry, "streamrank_embedding_cache_bytes") == s["bytes"]
    assert sample(registry, "streamrank_embedding_fetch_seconds_count") == 2
    assert sample(registry, "streamrank_embedding_fetch_rows_sum") == 7


async def test_versions_never_share_cached_rows(
    store: EmbeddingStore, two_versions: tuple[str, str]
) -> None:
    va, vb = two_versions
    emb = CachedEmbeddings(store=store, cache_bytes=1 << 20)
    a = await emb.lookup(va, "item", IDS[:50])
    b = await emb.lookup(vb, "item", IDS[:50])
    assert np.array_equal(a, roundtrip(matrix(2000, 32, 1)[:50], "int8"))
    assert np.array_equal(b, roundtrip(matrix(2000, 32, 2)[:50], "fp16"))
    assert emb.stats()["misses"] == 100 and emb.stats()["hits"] == 0


async def test_byte_budget_and_evictions(
    store: EmbeddingStore, two_versions: tuple[str, str]
) -> None:
    va, _ = two_versions
    registry = CollectorRegistry()
    budget = 100 * (36 + ENTRY_OVERHEAD_BYTES)
    emb = CachedEmbeddings(store=store, cache_bytes=budget, policy="lru", registry=registry)
    expected = roundtrip(matrix(2000, 32, 1), "int8")
    for start in range(0, 1050, 150):
        got = await emb.lookup(va, "item", IDS[start : start + 150])
        assert np.array_equal(got, expected[start : start + 150])
    s = emb.stats()
    assert s["bytes"] <= budget and s["entries"] == 100
    assert s["evictions"] == 1050 - 100
    assert sample(registry, "streamrank_embedding_cache_evictions_total") == 950
    # An LRU keeps the most recent 100.
    hits_before = s["hits"]
    await emb.lookup(va, "item", IDS[950:1050])
    assert emb.stats()["hits"] - hits_before == 100


async def test_warm_preloads_top_ids(store: EmbeddingStore, two_versions: tuple[str, str]) -> None:
    va, _ = two_versions
    budget = 300 * (36 + ENTRY_OVERHEAD_BYTES)
    emb = CachedEmbeddings(store=store, cache_bytes=budget)

    class Popularity:
        async def item_popularity(self, item_ids: list[str]) -> np.ndarray:
            return np.array([-float(int(i[1:])) for i in item_ids])  # m0 most popular

    loaded = await emb.warm_by_popularity(va, "item", Popularity(), IDS, k=200)
    assert loaded == 200
    hot = [f"m{k}" for k in range(200)]
    trips = RoundTrips.count
    got = await emb.lookup(va, "item", hot[:150])
    assert RoundTrips.count == trips
    assert emb.stats()["hits"] == 150
    assert np.array_equal(
        got, roundtrip(matrix(2000, 32, 1), "int8")[[int(h[1:]) for h in hot[:150]]]
    )
    # The cache is never over budget, even when asked to warm more than fits.
    await emb.warm(va, "item", IDS)
    assert emb.stats()["bytes"] <= budget


async def test_concurrent_lookups_share_the_cache_consistently(
    store: EmbeddingStore, two_versions: tuple[str, str]
) -> None:
    import asyncio

    va, _ = two_versions
    emb = CachedEmbeddings(store=store, cache_bytes=1 << 20)
    expected = roundtrip(matrix(2000, 32, 1), "int8")
    batches = [IDS[k : k + 100] for k in range(0, 400, 50)]  # overlapping halves
    results = await asyncio.gather(*(emb.lookup(va, "item", b) for b in batches))
    for k, got in zip(range(0, 400, 50), results, strict=True):
        assert np.array_equal(got, expected[k : k + 100])
    s = emb.stats()
    # Each id is held once, even when two in-flight lookups fetched it.
    assert s["entries"] == 450 and s["bytes"] == 450 * (36 + ENTRY_OVERHEAD_BYTES)
    assert s["hits"] + s["misses"] == 800


async def test_zero_budget_caches_nothing(
    store: EmbeddingStore, two_versions: tuple[str, str]
) -> None:
    va, _ = two_versions
    emb = CachedEmbeddings(store=store, cache_bytes=0)
    first = await emb.lookup(va, "item", IDS[:10])
    again = await emb.lookup(va, "item", IDS[:10])
    assert np.array_equal(first, again)
    assert emb.stats()["entries"] == 0 and emb.stats()["misses"] == 20


async def test_redis_down_is_a_retriable_error() -> None:
    from streamrank.errors import RedisUnavailable
    from workbench.devstack.services import free_port

    down = EmbeddingStore.from_url(
        f"redis://127.0.0.1:{free_port()}/0",
        client_kwargs={"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
    )
    async with down:
        emb = CachedEmbeddings(store=down, cache_bytes=1 << 20)
        with pytest.raises(RedisUnavailable) as info:
            await emb.lookup("v1", "item", ["a"])
        assert info.value.retriable
        with pytest.raises(RedisUnavailable):
            await down.versions()
        with pytest.raises(RedisUnavailable, match="deleting version 'v1'"):
            await delete_version(down, "v1")


@pytest.mark.parametrize("second_encoding", ["int8", "fp16"])
async def test_republished_version_never_mixes_cached_rows_of_the_old_publish(
    store: EmbeddingStore, stack: StackInfo, unique: str, second_encoding: str
) -> None:
    # The writer is another process: it deletes the version and publishes it again under the
    # same name (new rows, maybe another encoding) while this cache holds rows of the first one.
    writer_client = counting_client(stack.redis_url, decode_responses=False)
    writer = EmbeddingStore(redis=writer_client)
    version = f"crepub-{unique}"
    first, second = matrix(300, 32, 11), matrix(300, 32, 12)
    ids = IDS[:300]
    try:
        await writer.publish("item", ids, first, encoding="int8", version=version, progress=False)
        emb = CachedEmbeddings(store=store, cache_bytes=1 << 20)
        old = await emb.lookup(version, "item", ids[:100])
        assert np.array_equal(old, roundtrip(first[:100], "int8"))
        await delete_version(writer, version)
        await writer.publish(
            "item", ids, second, encoding=second_encoding, version=version, progress=False
        )
        # 50 cached ids (of the deleted publish) + 50 misses: the misses reveal the new publish,
        # and then every row must come from it, decoded with its encoding.
        got = await emb.lookup(version, "item", ids[50:150])
        assert np.array_equal(got, roundtrip(second[50:150], second_encoding))
        # And from now on the cache serves the new rows, without a round trip.
        trips = RoundTrips.count
        again = await emb.lookup(version, "item", ids[50:150])
        assert RoundTrips.count == trips
        assert np.array_equal(again, got)
        # Warm-up skips only the rows of the current publish.
        assert await emb.warm(version, "item", ids[:60]) == 50
        assert np.array_equal(
            await emb.lookup(version, "item", ids[:50]), roundtrip(second[:50], second_encoding)
        )
    finally:
        await delete_version(writer, version)
        await writer_client.aclose()
