"""The scoring worker's item cache: reads reused within their TTL and window group only."""

from __future__ import annotations

from streams.batch_read import BatchPlan, FeatureQuery, ItemCache, ItemFeatures
from streams.windows import Window

WINDOWS = (Window("1h", 3600, 300), Window("24h", 86400, 3600))
T = 1_700_000_100_000


def test_entries_live_for_their_ttl_in_their_group_only() -> None:
    now = [100.0]
    cache = ItemCache(2.0, clock=lambda: now[0])
    seen = ItemFeatures(3, 7, "drama")
    cache.put("x", "g1", seen, cache.now())
    assert cache.get("x", "g1", 101.9) is seen
    assert cache.get("x", "g2", 101.0) is None  # another window group: another read
    assert cache.get("y", "g1", 101.0) is None
    assert cache.get("x", "g1", 102.1) is None  # older than the TTL
    small = ItemCache(1.0, max_entries=2)
    for item in ("a", "b", "c"):
        small.put(item, "g", seen, 0.0)
    assert small.get("c", "g", 0.0) is seen and small.get("a", "g", 0.0) is None


def test_a_plan_reads_only_the_items_the_cache_does_not_hold() -> None:
    now = [50.0]
    cache = ItemCache(5.0, clock=lambda: now[0])
    queries = [FeatureQuery("u", T, ["x", "y"])]
    first = BatchPlan(queries, WINDOWS, counters=True, attributes=True, cache=cache)
    item_calls = [c for c in first.calls if c.args[0] == "i"]
    assert sorted(i for c in item_calls for i in c.args[5:]) == ["x", "y"]
    replies = [
        [[], 0, 0, [], []] if c.args[0] == "u" else [4, 9, b'{"category": "c"}'] * (len(c.args) - 5)
        for c in first.calls
    ]
    got = first.results(queries, replies)[0].items
    assert got == [ItemFeatures(4, 9, "c"), ItemFeatures(4, 9, "c")]
    again = BatchPlan(
        [FeatureQuery("u", T, ["x", "z"])], WINDOWS, counters=True, attributes=True, cache=cache
    )
    assert [i for c in again.calls if c.args[0] == "i" for i in c.args[5:]] == ["z"]
    # without attributes the same item is another entry (its category was not read)
    bare = BatchPlan(queries, WINDOWS, counters=True, attributes=False, cache=cache)
    assert sorted(i for c in bare.calls if c.args[0] == "i" for i in c.args[5:]) == ["x", "y"]
    now[0] += 6.0  # past the TTL: read again
    late = BatchPlan(queries, WINDOWS, counters=True, attributes=True, cache=cache)
    assert sorted(i for c in late.calls if c.args[0] == "i" for i in c.args[5:]) == ["x", "y"]
