"""The scoring read against a real Redis: clicks written by the real writer, then
``FeatureReader.read_batch`` equals a brute-force count over the written events (closed
buckets, events before the as-of time), attributes round-trip, and the whole batch is one
round trip."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from schemas import ClickEvent
from streamrank import keys
from streamrank.settings import Settings
from streams.attributes import write_attributes
from streams.reader import (
    FeatureQuery,
    FeatureReader,
    ItemFeatures,
    RequestFeatures,
    SequenceEvent,
    UserFeatures,
)
from streams.windows import (
    Window,
    bucket_expire_at_ms,
    bucket_start,
    closed_range,
    windows_from_settings,
)
from tests.integration.support.embeddings import RoundTrips, commandstats
from tests.integration.support.features import counted_at, writer_for

HOUR, MINUTE = 3600 * 1000, 60 * 1000


async def write(settings: Settings, redis: Any, events: list[ClickEvent], now_ms: int) -> int:
    """Apply ``events`` as the features worker does (one call per slot group)."""
    return int(await writer_for(settings, redis)(events, now_ms))


def counted(
    events: list[ClickEvent], as_of_ms: int, window: Window, *, written_at: int, lateness_s: int
) -> list[ClickEvent]:
    """Brute force: the events a window as of ``as_of_ms`` counts (its closed range, and a
    bucket still alive when the event was written)."""
    lo, hi = closed_range(as_of_ms, window)
    out = []
    for e in events:
        start = bucket_start(e.ts, window.resolution_s)
        alive = bucket_expire_at_ms(start, window, lateness_s) > written_at
        if lo * 1000 <= e.ts < hi * 1000 and alive:
            out.append(e)
    return out


def expected(
    settings: Settings,
    events: list[ClickEvent],
    query: FeatureQuery,
    *,
    written_at: int,
    attributes: dict[str, dict[str, str]],
    categories: dict[str, str],
) -> RequestFeatures:
    fine, coarse = windows_from_settings(settings.features)
    lateness = settings.features.counter_lateness_s
    mine = [e for e in events if e.user_id == query.user_id]
    seq = sorted((e for e in mine if e.ts < query.as_of_ms), key=lambda e: (e.ts, e.event_id))
    day = counted(mine, query.as_of_ms, coarse, written_at=written_at, lateness_s=lateness)
    per_category: dict[str, int] = {}
    for e in day:
        if e.category:
            per_category[e.category] = per_category.get(e.category, 0) + 1
    user = UserFeatures(
        [SequenceEvent(e.item_id, e.category, e.ts, e.event_id, e.action) for e in seq],
        len(counted(mine, query.as_of_ms, fine, written_at=written_at, lateness_s=lateness)),
        len(day),
        dict(sorted(per_category.items())),
        attributes.get(query.user_id, {}),
    )
    items = []
    for item in query.items:
        theirs = [e for e in events if e.item_id == item]
        items.append(
            ItemFeatures(
                len(counted(theirs, query.as_of_ms, fine, written_at=written_at, lateness_s=lateness)),
                len(counted(theirs, query.as_of_ms, coarse, written_at=written_at, lateness_s=lateness)),
                categories.get(item),
            )
        )  # fmt: skip
    return RequestFeatures(user, items)


@pytest.mark.cluster  # one script call per hash slot, one pipeline per node
async def test_read_batch_equals_a_brute_force_count_in_one_round_trip(
    make_settings, redis, unique
) -> None:  # type: ignore[no-untyped-def]
    # no item cache: every candidate is read, so every item call can be counted
    settings = make_settings(STREAMRANK_SEQUENCE_LENGTH=1000, STREAMRANK_FEATURES_ITEM_CACHE_S=0)
    reader = FeatureReader(redis=redis, features=settings.features)
    rng = random.Random(21)
    now = int(time.time() * 1000)
    users = [f"u{k}-{unique}" for k in range(5)]
    items = [f"i{k}-{unique}" for k in range(12)]
    actions = ["click", "view", "cart", "purchase"]
    events = [
        ClickEvent(
            f"{unique}-{n:04d}", rng.choice(users), rng.choice(items),
            now + rng.randrange(-26 * HOUR, 10 * MINUTE),  # some after the as-of times
            rng.choice(["drama", "comedy", None]), rng.choice(actions),  # type: ignore[arg-type]
        )
        for n in range(400)
    ]  # fmt: skip
    events += [ClickEvent(f"{unique}-tie{n}", users[0], items[n], now, "drama") for n in range(3)]
    assert await write(settings, redis, events, now) == len(events)
    user_attrs = {users[0]: {"age": "24", "gender": "M"}, users[2]: {"occupation": "writer"}}
    categories = {items[0]: "Action|Comedy", items[5]: "Drama"}
    await write_attributes(
        redis, users=user_attrs, items={i: {"category": c} for i, c in categories.items()}
    )
    queries = [
        FeatureQuery(users[0], now, [*items, f"unknown-{unique}", items[3]]),
        FeatureQuery(users[1], now - 1, items[3:6]),  # ms apart: usually the same window group
        FeatureQuery(users[0], now - 2 * HOUR, [items[0], items[5]]),  # a replay: another group
        FeatureQuery(users[2], now + 1, []),
        FeatureQuery(f"nobody-{unique}", now, [items[1]]),
    ]
    await reader.read_batch(queries[:1], counters=True, attributes=True)  # script loaded
    before, trips = await commandstats(redis), RoundTrips.count
    got = await reader.read_batch(queries, counters=True, attributes=True)
    assert RoundTrips.count - trips == 1  # one pipeline: every node at once on a cluster
    for query, found in zip(queries, got, strict=True):
        want = expected(
            settings, events, query, written_at=now, attributes=user_attrs, categories=categories
        )
        assert found == want, query
    # what the brute force counted is not nothing: the comparison is not vacuous
    assert got[0].user.clicks_24h > got[0].user.clicks_1h > 0 and got[0].user.categories_24h
    assert got[0].user.sequence[-1].ts < now and got[0].user.attributes == user_attrs[users[0]]
    assert {e.action for e in got[0].user.sequence} == set(actions)
    assert any(i.clicks_1h for i in got[0].items) and got[0].items[0].category == "Action|Comedy"
    # one script call per (user, window group) and per (item shard, window group)
    groups = {_group(settings, q) for q in queries}
    calls = {(q.user_id, _group(settings, q)) for q in queries}
    shards = {(keys.item_shard(i), _group(settings, q)) for q in queries for i in q.items}
    stats = await commandstats(redis)
    assert stats["evalsha"] - before.get("evalsha", 0) == len(calls) + len(shards)
    assert len(groups) >= 2


def _group(settings: Settings, query: FeatureQuery) -> tuple[int, ...]:
    return tuple(
        closed_range(query.as_of_ms, w)[1] for w in windows_from_settings(settings.features)
    )


@pytest.mark.cluster  # one script call per hash slot, one pipeline per node
async def test_a_click_at_or_after_as_of_is_neither_in_the_sequence_nor_counted(
    make_settings, redis, unique
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    reader = FeatureReader(redis=redis, features=settings.features)
    now = int(time.time() * 1000)
    at = counted_at(settings, now, "24h")  # a coarse (and fine) bucket boundary: closes both
    user, other, item = f"u-{unique}", f"o-{unique}", f"x-{unique}"
    before = [
        ClickEvent(f"{unique}-a", user, item, at - 1, "drama", "view"),
        ClickEvent(f"{unique}-b", other, item, at - 2 * MINUTE, "drama"),  # another user's
    ]
    assert await write(settings, redis, before, now) == 2
    query = FeatureQuery(user, at, [item])
    (first,) = await reader.read_batch([query], counters=True, attributes=False)
    assert [e.event_id for e in first.user.sequence] == [f"{unique}-a"]
    assert first.user.sequence[0].action == "view"
    assert (first.user.clicks_1h, first.user.clicks_24h) == (1, 1)
    assert first.items == [ItemFeatures(2, 2, None)]  # the other user's click counts for the item
    late = [
        ClickEvent(f"{unique}-c", user, item, at, "drama"),  # the same ms: not known yet
        ClickEvent(f"{unique}-d", other, item, at + 1000, "comedy"),
    ]
    assert await write(settings, redis, late, now) == 2
    (second,) = await reader.read_batch([query], counters=True, attributes=False)
    assert second == first  # the request's features do not move
    (later,) = await reader.read_batch(
        [FeatureQuery(user, at + 2 * MINUTE, [item])], counters=True, attributes=False
    )
    assert [e.event_id for e in later.user.sequence] == [f"{unique}-a", f"{unique}-c"]
    assert later.items[0].clicks_24h == 2  # the new clicks' bucket has not closed yet
    (hour_on,) = await reader.read_batch(
        [FeatureQuery(user, at + HOUR, [item])], counters=True, attributes=False
    )
    assert hour_on.items[0].clicks_24h == 4 and hour_on.user.categories_24h == {"drama": 2}


@pytest.mark.cluster  # one script call per hash slot, one pipeline per node
async def test_attributes_round_trip_and_a_load_is_idempotent(make_settings, redis, unique) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    reader = FeatureReader(redis=redis, features=settings.features)
    users = {"1": {"age": "24", "gender": "M", "occupation": "technician"}, "2": {}}
    items = {f"{k}-{unique}": {"category": f"c{k}|Drama"} for k in range(40)}
    prefix = f"run{unique}-"
    counts = await write_attributes(redis, users=users, items=items, user_prefix=prefix, chunk=16)
    assert counts == {"users": 1, "items": 40, "round_trips": 1 + 3}  # user "2" has none
    again = await write_attributes(redis, users=users, items=items, user_prefix=prefix)
    assert again["users"] == 1 and again["items"] == 40
    assert await redis.hgetall(keys.user_attributes(f"{prefix}1")) == {
        b"age": b"24",
        b"gender": b"M",
        b"occupation": b"technician",
    }
    assert not await redis.exists(keys.user_attributes("1"))  # only under the prefix
    candidates = [*items, f"unknown-{unique}"]
    trips = RoundTrips.count
    got = await reader.read_batch(
        [FeatureQuery(f"{prefix}1", int(time.time() * 1000), candidates)],
        counters=False,
        attributes=True,
    )
    assert RoundTrips.count - trips <= 2  # one, plus a script load on a node that lacked it
    assert got[0].user.attributes == users["1"]
    assert [i.category for i in got[0].items] == [f"c{k}|Drama" for k in range(40)] + [None]
    assert all(i.clicks_1h == i.clicks_24h == 0 for i in got[0].items)


@pytest.mark.cluster  # one script call per hash slot, one pipeline per node
async def test_without_counters_and_attributes_the_read_is_one_zrange_per_user(
    make_settings, redis, unique
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    reader = FeatureReader(redis=redis, features=settings.features)
    now = int(time.time() * 1000)
    user = f"u-{unique}"
    events = [ClickEvent(f"{unique}-{n}", user, f"i{n}", now - 1000 * n, "drama") for n in range(5)]
    assert await write(settings, redis, events, now) == 5
    queries = [
        FeatureQuery(user, now - 2500, ["i1", "i2"]),
        FeatureQuery(user, now + 1, ["i1"]),
        FeatureQuery(f"nobody-{unique}", now, ["i3"]),
    ]
    before, trips = await commandstats(redis), RoundTrips.count
    got = await reader.read_batch(queries, counters=False, attributes=False)
    assert RoundTrips.count - trips == 1
    stats = await commandstats(redis)
    assert stats["zrange"] - before["zrange"] == 2  # one per distinct user
    assert stats.get("evalsha", 0) == before.get("evalsha", 0)  # no script
    sequences = (await reader.get_sequences([user]))[user]
    assert got[0].user == UserFeatures([e for e in sequences if e.ts < now - 2500], 0, 0, {}, {})
    assert [e.item_id for e in got[0].user.sequence] == ["i4", "i3"]
    assert got[1].user.sequence == sequences and len(sequences) == 5
    assert got[0].items == [ItemFeatures(0, 0, None)] * 2
    assert got[2].user.sequence == [] and got[2].items == [ItemFeatures(0, 0, None)]
    assert await reader.read_batch([], counters=True, attributes=True) == []


# the CLI's writes are write_attributes' (above): the single-server pass is enough
async def test_features_load_reads_movielens_files_into_the_tables(
    make_settings, redis, unique, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    folder = tmp_path / "ml-100k"
    folder.mkdir()
    (folder / "ml-100k.user").write_text(
        "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
        "1\t24\tM\ttechnician\t85711\n2\t53\tF\tother\t94043\n"
    )
    (folder / "ml-100k.item").write_text(
        "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
        f"a{unique}\tToy Story\t1995\tAnimation Children's Comedy\nb{unique}\tX\t1995\t\n"
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "workbench.cli", "features", "load", *args],
            capture_output=True,
            text=True,
            env={**os.environ, **settings.as_env()},
        )

    done = await asyncio.to_thread(cli, "--data", str(tmp_path), "--user-prefix", f"{unique}-")
    assert done.returncode == 0, done.stderr
    assert '"users": 2' in done.stdout and '"items": 2' in done.stdout
    assert await redis.hget(keys.user_attributes(f"{unique}-2"), "occupation") == b"other"
    shard = keys.item_shard(f"a{unique}")
    raw = await redis.hget(keys.item_attributes(shard), f"a{unique}")
    assert raw == b'{"category":"Animation|Children\'s|Comedy"}'
    empty = await redis.hget(keys.item_attributes(keys.item_shard(f"b{unique}")), f"b{unique}")
    assert empty == b'{"category":"unknown"}'  # as Dataset.item_category names it
    missing = await asyncio.to_thread(cli, "--users", str(tmp_path / "nope.user"))
    assert missing.returncode != 0 and "nope.user: no such file" in missing.stderr
