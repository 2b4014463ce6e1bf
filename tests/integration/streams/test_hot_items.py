"""The hot items against a real Redis, clicks written by the features writer: the window's
closed buckets summed over every item shard, best first, ties by id, as of a time; one round
trip; the incremental reader gives the whole read's answer from fewer buckets.

The clicks are at a random time months ahead (written as if it were then), so no other test's
item counters share their buckets; every key they made is deleted at the end."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from schemas import ClickEvent
from scoring.serving.hotpool import HotPool
from streamrank import keys
from streamrank.settings import Settings
from streams.hot_items import HotItemsReader, read_hot_items
from streams.windows import Window, bucket_start, closed_range, windows_from_settings
from tests.integration.support.embeddings import RoundTrips
from tests.integration.support.features import writer_for

pytestmark = pytest.mark.cluster  # one HGETALL per shard and bucket, one pipeline per node

HOUR = 3_600_000


def expected_top(events: list[ClickEvent], window: Window, as_of_ms: int, n: int) -> list[Any]:
    """Brute force: the clicks with ``lo <= ts < hi`` of the window's closed range."""
    lo, hi = closed_range(as_of_ms, window)
    counts = Counter(e.item_id for e in events if lo * 1000 <= e.ts < hi * 1000)
    return sorted(counts.items(), key=lambda p: (-p[1], p[0]))[:n]


def item_keys(settings: Settings, events: list[ClickEvent]) -> list[str]:
    """Every key the writer made for ``events`` (they live until months ahead)."""
    names: set[str] = set()
    for window in windows_from_settings(settings.features):
        res = window.resolution_s
        for e in events:
            shard = keys.item_shard(e.item_id)
            names.add(keys.item_counter_bucket(shard, res, bucket_start(e.ts, res)))
            names.add(keys.user_counter_bucket(e.user_id, res, bucket_start(e.ts, res)))
    for e in events:
        names.update(
            (keys.item_seen(keys.item_shard(e.item_id), e.event_id), keys.sequence(e.user_id),
             keys.seen(e.user_id, e.event_id))
        )  # fmt: skip
    return sorted(names)


@pytest.fixture
async def clicks(
    make_settings: Callable[..., Settings], redis: Any, unique: str
) -> AsyncIterator[Any]:
    """``write(events, now_ms)``: the features writer's batch as of ``now_ms``; the keys it made
    are deleted afterwards."""
    settings = make_settings()
    write = writer_for(settings, redis)
    written: list[ClickEvent] = []

    async def apply(events: list[ClickEvent], now_ms: int) -> int:
        written.extend(events)
        return int(await write(events, now_ms))

    yield apply
    for name in item_keys(settings, written):
        await redis.delete(name)


def future_day(seed: str) -> int:
    """A day boundary 30-300 days ahead (epoch ms), different per test."""
    days = random.Random(seed).randrange(30, 300)
    return (int(time.time() * 1000) // (24 * HOUR) + days) * 24 * HOUR


async def test_the_window_as_of_a_time_counts_closed_buckets_only(
    make_settings: Callable[..., Settings], redis: Any, clicks: Any, unique: str
) -> None:
    settings = make_settings()
    fine, coarse = windows_from_settings(settings.features)
    at = future_day(unique) + 5 * HOUR
    rng = random.Random(3)
    items = [f"hot-{unique}-{k:02d}" for k in range(40)]  # spread over the 16 shards
    events: list[ClickEvent] = []
    for k, item in enumerate(items):  # item k: 40 - k clicks rounded down to even: pairs tie
        for c in range((40 - k) // 2 * 2):
            ts = at - rng.randrange(1, 23 * HOUR)
            events.append(ClickEvent(f"{unique}-{k}-{c}", f"u-{unique}-{c % 7}", item, ts))
    late = [ClickEvent(f"{unique}-open-{c}", f"u-{unique}-0", items[-1], at + 60_000 + c)
            for c in range(50)]  # in the bucket still open at `at`: not counted yet  # fmt: skip
    old = [ClickEvent(f"{unique}-old", f"u-{unique}-1", items[-2], at - 25 * HOUR)]
    assert await clicks(events + late + old, at) == len(events) + len(late) + len(old)
    assert {keys.item_shard(i) for i in items} == set(range(keys.ITEM_COUNTER_SHARDS))

    want = expected_top(events, coarse, at, 25)
    assert want[:3] == [(items[0], 40), (items[1], 38), (items[2], 38)]  # ties by id
    trips = RoundTrips.count
    assert await read_hot_items(redis, coarse, as_of_ms=at, n=25) == want
    assert RoundTrips.count - trips == 1
    reader = HotItemsReader(redis=redis, features=settings.features)
    assert await reader.hot_items("24h", as_of_ms=at, n=25) == want
    assert reader.buckets_read == 24
    assert await reader.hot_items("1h", as_of_ms=at, n=5) == expected_top(events, fine, at, 5)
    pool = HotPool(reader=reader, window="24h", size=3, refresh_s=5.0, clock=lambda: at)
    assert await pool.refresh() and pool.items() == tuple(item for item, _ in want[:3])

    # An hour on, the open bucket has closed: its 50 clicks count, the oldest hour left.
    later = at + HOUR
    want_later = expected_top(events + late + old, coarse, later, 40)
    assert want_later[0] == (items[-1], 50)
    trips = RoundTrips.count
    assert await reader.hot_items("24h", as_of_ms=later, n=40) == want_later
    assert RoundTrips.count - trips == 1
    # 1h: its first read; the pool: 2 resynced; now: the new bucket and 2 resynced
    assert reader.buckets_read == 24 + 12 + 2 + 1 + 2
    assert await read_hot_items(redis, coarse, as_of_ms=later, n=40) == want_later


async def test_a_late_click_into_a_closed_bucket_shows_once_the_bucket_is_read_again(
    make_settings: Callable[..., Settings], redis: Any, clicks: Any, unique: str
) -> None:
    settings = make_settings()
    at = future_day(unique) + 12 * HOUR
    a, b = f"hot-{unique}-a", f"hot-{unique}-b"
    first = [ClickEvent(f"{unique}-a{c}", f"u-{unique}", a, at - 2 * HOUR) for c in range(3)]
    first += [ClickEvent(f"{unique}-b{c}", f"u-{unique}", b, at - 3 * HOUR) for c in range(2)]
    await clicks(first, at)
    reader = HotItemsReader(redis=redis, features=settings.features, resync=2)
    assert await reader.hot_items("24h", as_of_ms=at, n=2) == [(a, 3), (b, 2)]
    # two late clicks of b into its closed bucket: the whole read sees them at once...
    late = [ClickEvent(f"{unique}-late{c}", f"u-{unique}", b, at - 3 * HOUR) for c in range(2)]
    await clicks(late, at + 1000)
    _, coarse = windows_from_settings(settings.features)
    assert await read_hot_items(redis, coarse, as_of_ms=at, n=2) == [(b, 4), (a, 3)]
    # ...the incremental reader within 24 / 2 = 12 reads (each reads the 2 read longest ago)
    seen = []
    for _ in range(12):
        seen.append(await reader.hot_items("24h", as_of_ms=at, n=2))
    assert seen[-1] == [(b, 4), (a, 3)] and seen[0] == [(a, 3), (b, 2)]
