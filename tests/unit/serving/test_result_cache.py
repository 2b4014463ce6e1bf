"""The result cache alone: keys, the sequence version, hits only for the same sequence version
within the TTL, the LRU bound, the latest result for the Redis-down rung, ``off``."""

from __future__ import annotations

import asyncio

import pytest

from schemas import RankRequest
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.result_cache import (
    EMPTY_SEQUENCE,
    CachedResult,
    LocalResults,
    ResultCache,
    ResultKey,
    sequence_version,
)
from streamrank import keys
from tests.unit.serving.test_service import Event


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def key(user: str = "u1", version: str = "v1", **kw: object) -> ResultKey:
    return ResultKey.of(RankRequest("r", user, **kw), version, 10)  # type: ignore[arg-type]


def result(sequence: str, *items: str) -> CachedResult:
    return CachedResult(sequence, items, tuple(1.0 / (n + 1) for n in range(len(items))))


def no_bound() -> asyncio.Timeout:
    return asyncio.timeout(None)


def test_the_sequence_version_is_the_newest_event() -> None:
    assert sequence_version([]) == EMPTY_SEQUENCE
    events = [Event("a", 5, "e1"), Event("b", 9, "e2")]
    assert sequence_version(events) == "9:e2"
    assert sequence_version([*events, Event("c", 9, "e3")]) == "9:e3"


def test_keys_differ_by_what_shapes_the_result() -> None:
    base = key()
    assert key(exclude=("b", "a", "a")) == key(exclude=("a", "b"))  # a set, in any order
    variants = {
        base, key(user="u2"), key(version="v2"), key(scene="home"), key(exclude=("a",)),
        ResultKey.of(RankRequest("r", "u1"), "v1", 5),
    }  # fmt: skip
    assert len(variants) == 6
    assert len({k.redis_key() for k in variants}) == 6
    assert base.redis_key().startswith(f"sr:{keys.user_tag('u1')}:res:v1:")


def test_a_cached_result_survives_json() -> None:
    original = CachedResult("9:e2", ("a", "b"), (0.5, 0.25), {"as_of": 7, "codes": [1]})
    assert CachedResult.from_json(original.to_json()) == original
    cold = CachedResult("9:e2", ("a", "b"), (0.5, 0.25), None, {"b": ["Action", "Comedy"]})
    assert CachedResult.from_json(cold.to_json()) == cold
    with pytest.raises(ValueError, match="not a cached result"):
        CachedResult.from_json(b'{"sequence": "x", "items": [], "scores": [], "cold_start": [1]}')
    with pytest.raises(ValueError, match="not a cached result"):
        CachedResult.from_json(b'{"items": ["a"]}')
    with pytest.raises(ValueError, match="1 items and 2 scores"):
        CachedResult.from_json(b'{"sequence": "x", "items": ["a"], "scores": [1, 2]}')


def test_the_local_lru_keeps_the_latest_per_key_within_its_ttl_and_bound() -> None:
    clock = Clock()
    local = LocalResults(entries=2, ttl_s=30.0, clock=clock)
    local.put(key("u1"), result("s1", "a"))
    local.put(key("u1"), result("s2", "b"))  # the latest replaces the older one
    assert local.get(key("u1")) == result("s2", "b") and len(local) == 1
    local.put(key("u2"), result("s1", "c"))
    local.get(key("u1"))  # u1 used: u2 is now the least recently used
    local.put(key("u3"), result("s1", "d"))
    assert local.get(key("u2")) is None and local.get(key("u1")) is not None
    clock.now += 30.0
    assert local.get(key("u1")) is None and len(local) == 1  # expired entries are dropped


async def test_a_hit_needs_the_same_sequence_version() -> None:
    metrics = ScoringMetrics()
    cache = ResultCache(mode="local", ttl_s=30.0, entries=10, metrics=metrics, clock=Clock())
    cache.store([(key(), result("s1", "a", "b"))])
    found = await cache.lookup([key(), key(), key("u2")], ["s1", "s2", "s1"], bound=no_bound)
    assert found == [result("s1", "a", "b"), None, None]
    assert cache.latest(key()) == result("s1", "a", "b")  # whatever the sequence version
    assert metrics.result_cache_hits._value.get() == 1
    assert metrics.result_cache_misses._value.get() == 2
    assert metrics.result_cache_entries._value.get() == 1


async def test_off_keeps_nothing() -> None:
    cache = ResultCache(mode="off", ttl_s=30.0, entries=10)
    cache.store([(key(), result("s1", "a"))])
    assert await cache.lookup([key()], ["s1"], bound=no_bound) == [None]
    assert cache.latest(key()) is None


def test_redis_mode_needs_a_client() -> None:
    with pytest.raises(ValueError, match="needs a Redis client"):
        ResultCache(mode="redis", ttl_s=30.0, entries=10)
