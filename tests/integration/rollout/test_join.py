"""The outcome join script on the real Redis: statistics equal the ones computed from the final
clicks in one go, whatever the order the two streams arrive in, redelivery changes nothing,
attribution is last-touch within the window, and closing yields the outcome once."""

from __future__ import annotations

import dataclasses

import pytest

from schemas import ClickEvent
from scoring.rollout.join import JoinConfig, OutcomeStore, assemble
from scoring.rollout.online import Window, read_stats
from scoring.rollout.records import Served, outcome_record
from scoring.rollout.stats import SCALARS_FLOAT, VersionStats, stats_of_requests
from streamrank import keys
from tests.integration.support.embeddings import CountingRedis

pytestmark = pytest.mark.standalone_only(
    "online outcomes and rollouts need a standalone or Sentinel Redis (their join script is not "
    "cluster-safe yet)"
)

T0 = 1_900_000_000_000  # epoch ms; the join never reads the wall clock, only what it is told
CONFIG = JoinConfig(
    window_ms=60_000, close_delay_ms=5_000, bucket_s=10, seen_ttl_ms=3_600_000,
    stats_ttl_ms=3_600_000,
)  # fmt: skip


def served(rid: str, user: str, version: str, scores: list[float], at: int, **kw: object) -> Served:
    return Served(rid, user, version, tuple(f"i{j}" for j in range(len(scores))), tuple(scores),
                  at, **kw)  # type: ignore[arg-type]  # fmt: skip


def click(eid: str, user: str, item: str, ts: int) -> ClickEvent:
    return ClickEvent(event_id=eid, user_id=user, item_id=item, ts=ts)


async def window_stats(redis: CountingRedis, version: str) -> VersionStats:
    stats = await read_stats(redis, [version], Window(T0 - 60_000, T0 + 600_000, CONFIG.bucket_s))
    return stats[version]


def assert_same(got: VersionStats, want: VersionStats) -> None:
    for f in dataclasses.fields(VersionStats):
        g, w = getattr(got, f.name), getattr(want, f.name)
        if f.name in SCALARS_FLOAT:
            assert g == pytest.approx(w, abs=1e-9), f.name
        else:
            assert g == w, f.name


async def test_join_equals_the_one_go_statistics_in_any_order_and_under_redelivery(
    redis: CountingRedis, unique: str
) -> None:
    store = OutcomeStore(redis=redis)
    version = f"v-{unique}"
    users = [f"u{n}-{unique}" for n in range(4)]
    scores = [
        [0.9, 0.1, 0.5, 0.3],
        [0.2, 0.8, 0.4, 0.6],
        [0.5, 0.5, 0.1, 0.7],
        [0.3, 0.2, 0.1, 0.05],
    ]
    recs = [served(f"r{n}-{unique}", users[n], version, scores[n], T0 + 1000 * n) for n in range(4)]
    # u0 clicks its top item; u1 two items (the second click is the better-ranked one); u2 a
    # tie; u3 nothing. u1's first click and u2's click arrive *before* their served records.
    early = [
        click(f"e1a-{unique}", users[1], "i3", T0 + 1500),
        click(f"e2-{unique}", users[2], "i0", T0 + 2500),
    ]
    late = [
        click(f"e0-{unique}", users[0], "i0", T0 + 400),
        click(f"e1b-{unique}", users[1], "i1", T0 + 1600),
    ]
    first = assemble([], early, config=CONFIG, now_ms=T0 + 3000)
    counts = await store.apply(first)
    assert counts.buffered_clicks == 2 and counts.clicks == 0
    second = assemble(recs, late, config=CONFIG, now_ms=T0 + 3000)
    counts = await store.apply(second)
    assert counts.joined == 4 and counts.clicks == 4  # two from the buffer, two direct
    want = stats_of_requests(
        [(scores[0], [0]), (scores[1], [3, 1]), (scores[2], [0]), (scores[3], [])]
    )
    got = await window_stats(redis, version)
    assert_same(got, want)
    assert got.h1 == 2 and got.creq == 3  # u0 at rank 1, u1's better click at rank 1
    # every batch again (redelivery of both streams): nothing changes
    for call in (first, second):
        again = await store.apply(call)
        assert again.joined == 0 and again.clicks == 0
    assert (await store.apply(second)).duplicate_served == 4
    assert_same(await window_stats(redis, version), want)
    assert await redis.zscore(keys.outcome_versions(), version) == T0 + 3000


async def test_last_touch_window_and_repeated_clicks(redis: CountingRedis, unique: str) -> None:
    store = OutcomeStore(redis=redis)
    a, b, user = f"a-{unique}", f"b-{unique}", f"u-{unique}"
    older = served(f"r1-{unique}", user, a, [0.9, 0.1], T0)
    newer = served(f"r2-{unique}", user, b, [0.2, 0.7], T0 + 5000)
    await store.apply(assemble([older, newer], [], config=CONFIG, now_ms=T0 + 5000))
    clicks = [
        click(f"c1-{unique}", user, "i1", T0 + 6000),  # both ranked i1: the newer one gets it
        click(f"c2-{unique}", user, "i1", T0 + 7000),  # the same item again: repeated
        click(f"c3-{unique}", user, "i0", T0 + 2000),  # before the newer one: the older one
        click(f"c4-{unique}", user, "i0", T0 + 5000 + 61_000),  # after both windows: waits
    ]
    counts = await store.apply(assemble([], clicks, config=CONFIG, now_ms=T0 + 7000))
    assert (counts.clicks, counts.repeated_clicks, counts.buffered_clicks) == (2, 1, 1)
    sa, sb = await window_stats(redis, a), await window_stats(redis, b)
    assert (sa.clk, sa.h1, sb.clk, sb.h1) == (1, 1, 1, 1)
    # a served record of the degraded kind counts for its version, never joins
    deg = served(f"r3-{unique}", user, b, [0.5, 0.5], T0 + 8000, degraded=True, latency_ms=12.0)
    counts = await store.apply(assemble([deg], [], config=CONFIG, now_ms=T0 + 8000))
    assert counts.degraded == 1 and counts.joined == 0
    sb = await window_stats(redis, b)
    assert sb.deg == 1 and sb.req == 1 and sum(sb.lat.values()) == 1


async def test_closing_yields_each_outcome_once_and_stops_attribution(
    redis: CountingRedis, unique: str
) -> None:
    store = OutcomeStore(redis=redis)
    version, user = f"v-{unique}", f"u-{unique}"
    rec = served(f"r-{unique}", user, version, [0.1, 0.8, 0.4], T0)
    await store.apply(
        assemble([rec], [click(f"c-{unique}", user, "i2", T0 + 10)], config=CONFIG, now_ms=T0)
    )
    close_at = T0 + CONFIG.window_ms + CONFIG.close_delay_ms
    early = await store.claim_due(now_ms=close_at - 1, limit=10_000, visibility_ms=1000)
    assert all(c[0] != user for c in early)  # not due yet
    mine = [c for c in await store.claim_due(now_ms=close_at, limit=10_000, visibility_ms=30_000)
            if c[0] == user]  # fmt: skip
    assert len(mine) == 1
    _, request_id, pending = mine[0]
    assert pending is not None
    outcome = outcome_record(user, request_id, pending, closed_at=close_at)
    assert outcome["clicked"] == [{"item": "i2", "rank": 2, "event_id": f"c-{unique}"}]
    assert outcome["model_version"] == version and outcome["best_rank"] == 2
    # claimed: a second closer does not get it while the claim lasts
    again = await store.claim_due(now_ms=close_at + 1, limit=10_000, visibility_ms=30_000)
    assert all(c[0] != user for c in again)
    await store.finish([(user, request_id)])
    assert await redis.hlen(keys.outcome_open(user)) == 0
    assert await redis.hlen(keys.outcome_items(user)) == 0
    assert await redis.zscore(keys.outcome_due(), keys.outcome_due_member(user, request_id)) is None
    # a click after closing finds no open record; a redelivered served record is not re-joined
    late = click(f"c2-{unique}", user, "i1", T0 + 20)
    counts = await store.apply(assemble([rec], [late], config=CONFIG, now_ms=T0 + 30))
    assert counts.joined == 0 and counts.clicks == 0 and counts.buffered_clicks == 1
    stats = await window_stats(redis, version)
    assert stats.req == 1 and stats.clk == 1
