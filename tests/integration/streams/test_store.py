"""The batch script and the read API against a real Redis: order, dedupe, cap, TTL, windows."""

from __future__ import annotations

import random
import time
from typing import Any

import orjson
import pytest

from schemas import ClickEvent
from streamrank import keys
from streamrank.redis.client import on_each_server, slot_grouping, slot_of_tag
from streams.reader import FeatureReader, SequenceEvent
from streams.windows import windows_from_settings
from streams.writer import BatchCalls, BatchWriter
from tests.integration.support.embeddings import RoundTrips, commandstats
from tests.integration.support.features import batch_for, counted_at, writer_for

# The batch script runs once per hash-slot group and reads are one pipeline per node: the
# cluster pass of `make test` runs this module too.
pytestmark = pytest.mark.cluster


async def test_sequence_order_out_of_order_arrivals_and_redelivery(
    make_settings, redis, unique
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    write = writer_for(settings, redis)
    reader = FeatureReader(redis=redis, features=settings.features)
    user = f"u-{unique}"
    now = int(time.time() * 1000)
    # Same-second ties are ordered by event_id; later batches bring older events.
    first = [
        ClickEvent(f"{unique}-0003", user, "i3", now, "drama"),
        ClickEvent(f"{unique}-0001", user, "i1", now - 5000, "comedy"),
    ]
    second = [
        ClickEvent(f"{unique}-0002", user, "i2", now, None),  # same ts as 0003, smaller id
        ClickEvent(f"{unique}-0000", user, "i0", now - 9000, "drama"),  # out of order
        ClickEvent(f"{unique}-0003", user, "i3", now, "drama"),  # redelivered
    ]
    assert await write(first, now) == 2
    assert await write(second, now) == 2
    assert await write(second, now) == 0  # a whole replay applies nothing
    seqs = await reader.get_sequences([user, f"nobody-{unique}"])
    assert seqs[f"nobody-{unique}"] == []
    assert seqs[user] == [
        SequenceEvent("i0", "drama", now - 9000, f"{unique}-0000", "click"),
        SequenceEvent("i1", "comedy", now - 5000, f"{unique}-0001", "click"),
        SequenceEvent("i2", None, now, f"{unique}-0002", "click"),
        SequenceEvent("i3", "drama", now, f"{unique}-0003", "click"),
    ]
    day = await reader.get_counters(user_ids=[user], at_ms=counted_at(settings, now, "24h"))
    assert day["users"][user]["clicks_24h"] == 4
    assert day["users"][user]["categories_24h"] == {"comedy": 1, "drama": 2}
    hour = await reader.get_counters(user_ids=[user], at_ms=counted_at(settings, now, "1h"))
    assert hour["users"][user]["clicks_1h"] == 4


@pytest.mark.parametrize("contract", ["id_sets", "markers"])
async def test_cap_drops_oldest_and_ttls_are_set(make_settings, redis, unique, contract) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(
        STREAMRANK_SEQUENCE_LENGTH=5, STREAMRANK_SEQUENCE_TTL_S=1000, STREAMRANK_DEDUPE_TTL_S=500,
        STREAMRANK_FEATURES_WRITE_CONTRACT=contract,
    )  # fmt: skip
    write = writer_for(settings, redis)
    reader = FeatureReader(redis=redis, features=settings.features)
    user = f"u-{unique}"
    now = int(time.time() * 1000)
    events = [
        ClickEvent(f"{unique}-{i:04d}", user, f"i{i}", now - (20 - i) * 1000, None)
        for i in range(12)
    ]
    assert await write(events[6:], now) == 6
    assert await write(events[:6], now) == 6  # older ones arrive late: they fall off the cap
    seq = (await reader.get_sequences([user]))[user]
    assert [e.item_id for e in seq] == ["i7", "i8", "i9", "i10", "i11"]
    assert 990_000 <= await redis.pttl(keys.sequence(user)) <= 1_000_000
    if contract == "markers":
        assert 490_000 <= await redis.pttl(keys.seen(user, f"{unique}-0003")) <= 500_000
        # the item side's marker lives as long as the dedupe window (shorter than the buckets)
        marker = keys.item_seen(keys.item_shard("i3"), f"{unique}-0003")
        assert 490_000 <= await redis.pttl(marker) <= 500_000
    else:  # the id, in its slot group's set of this generation: gone after the next one
        grouping = slot_grouping(redis)
        generation = now // 500_000
        ids = keys.event_ids(grouping(keys.user_tag(user)) if grouping else 0, generation)
        assert await redis.sismember(ids, f"{user}\x1f{unique}-0003")
        assert not await redis.exists(keys.seen(user, f"{unique}-0003"))
        expire_at = (generation + 2) * 500_000
        assert abs(int(time.time() * 1000) + await redis.pttl(ids) - expire_at) < 2000
    fine, _coarse = windows_from_settings(settings.features)
    # The bucket of the newest event (not of `now`: a bucket boundary may fall in between).
    bucket = events[-1].ts // 1000 // fine.resolution_s * fine.resolution_s
    expire_at = (bucket + fine.resolution_s + 3600 + settings.features.counter_lateness_s) * 1000
    ttl = await redis.pttl(keys.user_counter_bucket(user, fine.resolution_s, bucket))
    assert abs((int(time.time() * 1000) + ttl) - expire_at) < 2000


async def test_windows_follow_event_time_and_buckets_expire(make_settings, redis, unique) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(
        STREAMRANK_COUNTER_BUCKET_S=60,
        STREAMRANK_COUNTER_COARSE_BUCKET_S=600,
        STREAMRANK_COUNTER_LATENESS_S=0,
    )
    write = writer_for(settings, redis)
    reader = FeatureReader(redis=redis, features=settings.features)
    user, item_a, item_b = f"u-{unique}", f"ia-{unique}", f"ib-{unique}"
    now = int(time.time() * 1000)
    at = counted_at(settings, now, "24h")  # a coarse bucket boundary, at most 10 min ahead
    hour, minute = 3600 * 1000, 60 * 1000
    events = [
        ClickEvent(f"{unique}-1", user, item_a, at - 5 * minute, "drama"),  # in 1 h and 24 h
        ClickEvent(f"{unique}-2", user, item_a, at - 3 * hour, "drama"),  # only 24 h
        ClickEvent(f"{unique}-3", user, item_b, at - 23 * hour, "comedy"),  # only 24 h
        ClickEvent(f"{unique}-4", user, item_b, at - 30 * hour, "comedy"),  # no window
    ]
    assert await write(events, now) == 4
    got = await reader.get_counters(user_ids=[user], item_ids=[item_a, item_b], at_ms=at)
    assert got["users"][user] == {
        "clicks_1h": 1,
        "clicks_24h": 3,
        "categories_24h": {"comedy": 1, "drama": 2},
    }
    assert got["items"] == {
        item_a: {"clicks_1h": 1, "clicks_24h": 2},
        item_b: {"clicks_1h": 0, "clicks_24h": 1},
    }
    pop = await reader.item_popularity([item_b, item_a, f"none-{unique}", item_a], at_ms=at)
    assert pop.tolist() == [1, 2, 0, 2]
    # Two hours later the 5-minute-old click has left the 1 h window and the 23 h old one
    # (now 25 h old) the 24 h window.
    later = await reader.get_counters(user_ids=[user], at_ms=at + 2 * hour)
    assert later["users"][user]["clicks_1h"] == 0
    assert later["users"][user]["clicks_24h"] == 2
    assert (await reader.item_popularity([item_b], at_ms=at + 2 * hour)).tolist() == [0]
    # The 30 h old event's buckets were never written; the others expire by themselves.
    old_bucket = (at - 30 * hour) // 1000 // 600 * 600
    assert not await redis.exists(keys.user_counter_bucket(user, 600, old_bucket))
    fine_bucket = (at - 5 * minute) // 1000 // 60 * 60
    ttl = await redis.pttl(keys.user_counter_bucket(user, 60, fine_bucket))
    expire_at = (fine_bucket + 60 + 3600) * 1000  # bucket end + window + lateness 0
    assert ttl > 0 and abs(int(time.time() * 1000) + ttl - expire_at) < 2000


async def connections_received(redis: Any) -> int:
    stats = await on_each_server(redis, "INFO", "stats")
    return sum(int(s["total_connections_received"]) for s in stats)


async def test_reads_are_one_round_trip_for_a_batch(make_settings, redis, unique) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    reader = FeatureReader(redis=redis, features=settings.features)
    await reader.get_sequences(["warm-up"])  # a connection to every node that may be read
    await reader.get_counters(user_ids=["warm-up"], item_ids=[str(i) for i in range(40)])
    before = await connections_received(redis)
    trips = RoundTrips.count
    users = [f"u{i}-{unique}" for i in range(64)]
    result = await reader.get_sequences(users)
    counters = await reader.get_counters(user_ids=users, item_ids=["a", "b"])
    assert set(result) == set(users) and set(counters["users"]) == set(users)
    assert RoundTrips.count - trips == 2  # one pipeline each (every node at once on a cluster)
    assert await connections_received(redis) == before  # on connections already open


async def test_a_batch_split_by_slot_equals_one_call_and_a_partial_write_is_retried_safely(
    make_settings, redis, unique
) -> None:  # type: ignore[no-untyped-def]
    """The cluster path (one call per hash slot) leaves the same state as one call for the
    whole batch; and after a partial failure (some calls applied, some not) the batch sent
    again applies every event exactly once: each slot's markers gate its own effects."""
    settings = make_settings(STREAMRANK_SEQUENCE_LENGTH=6)
    reader = FeatureReader(redis=redis, features=settings.features)
    now = int(time.time() * 1000)
    rng = random.Random(9)
    raw = [(f"{i:03d}", rng.randrange(8), rng.randrange(30), now - rng.randrange(90_000)) for i in range(150)]  # fmt: skip

    def events(tag: str) -> list[ClickEvent]:
        return [ClickEvent(f"{tag}-{e}", f"{tag}-u{u}", f"{tag}-i{i}", ts, f"c{i % 3}") for e, u, i, ts in raw]  # fmt: skip

    x, y, z = f"x{unique}", f"y{unique}", f"z{unique}"
    assert await writer_for(settings, redis)(events(x), now) == 150  # as the worker does it
    assert await writer_for(settings, redis, slot_of=slot_of_tag)(events(y), now) == 150
    split = batch_for(settings, events(z), now, slot_of_tag)
    assert len(split.calls) > 8  # 8 users and up to 16 item shards: many slots
    # Half the calls that carry users' entries and half of the others: which calls carry users
    # depends on the slots of this run's tags, so pick by content, not by position.
    with_users = [i for i, c in enumerate(split.calls) if orjson.loads(c.args[0])["n"][0]]
    assert len(with_users) >= 2
    kept = set(with_users[::2]) | {i for i in range(1, len(split.calls), 2) if i not in with_users}
    writer = BatchWriter(redis=redis)
    part = BatchCalls(
        [c for i, c in enumerate(split.calls) if i in kept],
        split.events,
        split.too_old_for_counters,
    )
    first = await writer.apply(part)  # a batch that failed after some of its calls
    assert 0 < first < 150
    assert first + await writer.apply(split) == 150  # the retry applies only the rest
    assert await writer.apply(split) == 0

    def strip(tag: str, value: object) -> object:
        return orjson.loads(orjson.dumps(value).decode().replace(tag, "T"))

    async def state(tag: str) -> object:
        users, items = [f"{tag}-u{u}" for u in range(8)], [f"{tag}-i{i}" for i in range(30)]
        seqs = {u: [e.to_dict() for e in s] for u, s in (await reader.get_sequences(users)).items()}
        at = counted_at(settings, now, "24h")
        counters = await reader.get_counters(user_ids=users, item_ids=items, at_ms=at)
        return strip(tag, {"seqs": seqs, "counters": counters})

    sx = await state(x)
    assert sx == await state(y) == await state(z)
    counters: Any = sx["counters"]  # type: ignore[index]
    assert sum(c["clicks_24h"] for c in counters["items"].values()) == 150
    assert sum(c["clicks_24h"] for c in counters["users"].values()) == 150


async def test_batches_commute_so_two_can_be_in_flight(make_settings, redis, unique) -> None:  # type: ignore[no-untyped-def]
    """Applying batch A then B leaves the same state as B then A (cap, dedupe, counters): the
    worker may therefore run the next batch's script before the previous one finished."""
    settings = make_settings(STREAMRANK_SEQUENCE_LENGTH=4)
    write = writer_for(settings, redis)
    reader = FeatureReader(redis=redis, features=settings.features)
    now = int(time.time() * 1000)
    rng = random.Random(5)
    raw = [
        (f"{i:03d}", rng.randrange(3), rng.randrange(6), now - rng.randrange(60_000))
        for i in range(40)
    ]

    def events(tag: str, picks: list[int]) -> list[ClickEvent]:
        out = []
        for i in picks:
            eid, user, item, ts = raw[i]
            out.append(
                ClickEvent(f"{tag}-{eid}", f"{tag}-u{user}", f"{tag}-i{item}", ts, f"c{item % 2}")
            )
        return out

    a = list(range(0, 25))
    b = list(range(15, 40))  # overlaps a: the shared events are replays for the second batch
    x, y = f"x{unique}", f"y{unique}"
    assert await write(events(x, a), now) + await write(events(x, b), now) == 40
    assert await write(events(y, b), now) + await write(events(y, a), now) == 40

    def strip(tag: str, value: object) -> object:
        return orjson.loads(orjson.dumps(value).decode().replace(tag, "T"))

    users = lambda tag: [f"{tag}-u{u}" for u in range(3)]  # noqa: E731
    items = lambda tag: [f"{tag}-i{i}" for i in range(6)]  # noqa: E731
    seq_x = {u: [e.to_dict() for e in s] for u, s in (await reader.get_sequences(users(x))).items()}
    seq_y = {u: [e.to_dict() for e in s] for u, s in (await reader.get_sequences(users(y))).items()}
    assert strip(x, seq_x) == strip(y, seq_y)
    assert all(len(s) == 4 for s in seq_x.values())
    at = counted_at(settings, now, "1h")
    cnt_x = await reader.get_counters(user_ids=users(x), item_ids=items(x), at_ms=at)
    cnt_y = await reader.get_counters(user_ids=users(y), item_ids=items(y), at_ms=at)
    assert strip(x, cnt_x) == strip(y, cnt_y)
    assert sum(c["clicks_1h"] for c in cnt_x["users"].values()) == 40


async def test_waiting_for_replicas_puts_every_write_on_a_replica(
    make_settings, redis, unique, stack, caplog
) -> None:  # type: ignore[no-untyped-def]
    """With ``redis_wait_replicas`` a batch returns only once each node's replicas have it, so
    a master killed right after the reply loses nothing (on a single server without replicas
    it proceeds and says so)."""
    import redis as sync_redis

    settings = make_settings()
    writer = BatchWriter(redis=redis, wait_replicas=1, wait_timeout_ms=5000)
    now = int(time.time() * 1000)
    events = [ClickEvent(f"{unique}-{n}", f"w{n % 20}-{unique}", f"i{n}", now, None) for n in range(200)]  # fmt: skip
    assert await writer.apply(batch_for(settings, events, now, slot_grouping(redis))) == 200
    if not stack.redis_cluster:
        assert "fewer than STREAMRANK_REDIS_WAIT_REPLICAS=1" in caplog.text
        return
    for n in range(20):  # every user's sequence is on its master's replica already
        key = keys.sequence(f"w{n}-{unique}")
        replica = redis.get_node_from_key(key, replica=True)
        direct = sync_redis.Redis(host=replica.host, port=replica.port)
        try:
            direct.execute_command("READONLY")
            assert direct.zcard(key) == 10
        finally:
            direct.close()


@pytest.mark.cluster_only("checks how the session's Redis Cluster spreads one batch")
async def test_one_batch_spreads_over_every_master_in_one_round_trip(
    make_settings, redis, unique
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    now = int(time.time() * 1000)
    events = [ClickEvent(f"{unique}-{n}", f"s{n % 60}-{unique}", f"i{n}", now, None) for n in range(600)]  # fmt: skip
    batch = batch_for(settings, events, now, slot_grouping(redis))
    await redis.initialize()  # the slot map
    assert len(batch.calls) > 60  # 60 users' slots and up to 16 item shards
    masters = {redis.get_node_from_key(call.target).name for call in batch.calls}
    assert masters == {n.name for n in redis.get_primaries()} and len(masters) == 3
    before = await commandstats(redis)
    trips = RoundTrips.count
    assert await BatchWriter(redis=redis).apply(batch) == 600
    assert RoundTrips.count - trips == 1  # one pipeline: every master written concurrently
    assert (await commandstats(redis))["evalsha"] - before["evalsha"] == len(batch.calls)
