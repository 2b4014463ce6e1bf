"""The ``markers`` contract's script arguments (streams.writer.assemble): one call on a single
server, one call per hash slot on a cluster, every event's user side and item side exactly
once (the ``id_sets`` contract: test_id_sets.py)."""

from __future__ import annotations

from collections import Counter

import orjson
from redis.crc import key_slot

from schemas import ClickEvent
from streamrank import keys
from streamrank.redis.client import slot_of_tag
from streams.windows import Window
from streams.writer import ITEM_ENTRY, USER_ENTRY, assemble

NOW = 1_800_000_000_000
WINDOWS = (Window("1h", 3600, 300), Window("24h", 86400, 3600))
FINE_START = NOW // 1000 // 300 * 300
COARSE_START = NOW // 1000 // 3600 * 3600


def entries(flat: list[object], width: int) -> list[list[object]]:
    """The script's flat entry list, one list per entry."""
    assert len(flat) % width == 0
    return [flat[k : k + width] for k in range(0, len(flat), width)]


def users(payload: dict[str, list[object]]) -> list[list[object]]:
    return entries(payload["u"], USER_ENTRY)


def items(payload: dict[str, list[object]]) -> list[list[object]]:
    return entries(payload["i"], ITEM_ENTRY)


def build(events: list[ClickEvent], **kw: object) -> object:
    args: dict[str, object] = dict(
        now_ms=NOW, windows=WINDOWS, lateness_s=600, sequence_length=50, sequence_ttl_s=100,
        dedupe_ttl_s=10, contract="markers",
    )  # fmt: skip
    args.update(kw)
    return assemble(events, **args)  # type: ignore[arg-type]


def test_one_call_on_a_single_server_indexes_users_and_buckets_once() -> None:
    events = [
        ClickEvent("e1", "u1", "i1", NOW, "drama"),
        ClickEvent("e2", "u1", "i2", NOW + 1, None, "cart"),
        ClickEvent("e3", "u2", "i1", NOW + 2, "comedy"),
    ]
    batch = build(events)
    [call] = batch.calls  # type: ignore[attr-defined]
    payload = orjson.loads(call.args[0])
    n_users = 2
    assert payload["n"] == [3, 3, n_users]
    assert payload["h"] == [50, "100000", "10000"]
    assert call.keys[:3] == ["sr:{u:u1}:seen:e1", "sr:{u:u1}:seen:e2", "sr:{u:u2}:seen:e3"]
    s1, s2 = keys.item_shard("i1"), keys.item_shard("i2")
    assert call.keys[3:6] == [
        f"sr:{{i:{s1}}}:seen:e1",
        f"sr:{{i:{s2}}}:seen:e2",
        f"sr:{{i:{s1}}}:seen:e3",
    ]
    assert call.keys[6:8] == ["sr:{u:u1}:seq", "sr:{u:u2}:seq"]
    buckets = call.keys[8:]
    assert len(buckets) == len(payload["x"]) == len(set(buckets))
    first, second, third = users(payload)
    assert first[:3] == [1, str(NOW), "e1\x1fi1\x1fdrama\x1fclick"] and first[5] == "c:drama"
    assert second[2] == "e2\x1fi2\x1f\x1fcart"  # the click's action is kept in the member
    assert buckets[first[3] - 1] == f"sr:{{u:u1}}:cnt:300:{FINE_START}"
    assert buckets[first[4] - 1] == f"sr:{{u:u1}}:cnt:3600:{COARSE_START}"
    assert payload["x"][first[3] - 1] == str((FINE_START + 300 + 3600 + 600) * 1000)
    assert payload["x"][first[4] - 1] == str((COARSE_START + 3600 + 86400 + 600) * 1000)
    assert second[0] == 1 and second[5] == ""  # same user, no category
    assert third[0] == 2
    i1, i2, i3 = items(payload)
    assert i1[3] == "i1" and buckets[i1[1] - 1] == f"sr:{{i:{s1}}}:cnt:300:{FINE_START}"
    assert buckets[i1[2] - 1] == f"sr:{{i:{s1}}}:cnt:3600:{COARSE_START}"
    assert i3[1:3] == i1[1:3]  # one item bucket shared across users
    assert i2[3] == "i2"
    # item markers live until the dedupe window ends (10 s here, before any bucket expires)
    assert {e[0] for e in items(payload)} == {str(NOW + 10_000)}
    assert batch.too_old_for_counters == 0  # type: ignore[attr-defined]


def test_expired_buckets_are_not_counted_and_need_no_item_marker() -> None:
    old = NOW - 2 * 86400 * 1000
    hour_old = NOW - 2 * 3600 * 1000
    batch = build(
        [ClickEvent("e1", "u1", "i1", old, None), ClickEvent("e2", "u1", "i1", hour_old, None)],
        dedupe_ttl_s=48 * 3600,
    )
    [call] = batch.calls  # type: ignore[attr-defined]
    payload = orjson.loads(call.args[0])
    first, second = users(payload)
    assert first[3:5] == [0, 0]  # two days old: no window reaches it
    assert second[3] == 0 and second[4] > 0  # too old for 1 h, still inside 24 h
    [item] = items(payload)  # only e2 is counted for its item
    assert item[1] == 0 and item[2] > 0
    coarse_start = hour_old // 1000 // 3600 * 3600
    assert item[0] == str((coarse_start + 3600 + 86400 + 600) * 1000)  # its last live bucket
    assert call.keys[2] == f"sr:{{i:{keys.item_shard('i1')}}}:seen:e2"
    assert batch.too_old_for_counters == 1  # type: ignore[attr-defined]
    assert payload["n"] == [2, 1, 1]


def test_on_a_cluster_each_call_touches_one_slot_and_every_side_appears_once() -> None:
    events = [
        ClickEvent(f"e{n}", f"u{n % 37}", f"i{n % 53}", NOW + n, "drama" if n % 2 else None)
        for n in range(400)
    ]
    batch = build(events, slot_of=slot_of_tag)
    calls = batch.calls  # type: ignore[attr-defined]
    user_sides: Counter[str] = Counter()
    item_sides: Counter[str] = Counter()
    for call in calls:
        assert len({key_slot(k.encode()) for k in call.keys}) == 1, call.keys
        assert key_slot(call.target.encode()) == key_slot(call.keys[0].encode())
        payload = orjson.loads(call.args[0])
        n_user, n_item, n_seq = payload["n"]
        user_sides.update(k.rsplit(":", 1)[1] for k in call.keys[:n_user])
        item_sides.update(k.rsplit(":", 1)[1] for k in call.keys[n_user : n_user + n_item])
        assert len(users(payload)) == n_user and len(items(payload)) == n_item
        assert len(call.keys) == n_user + n_item + n_seq + len(payload["x"])
    every = Counter(e.event_id for e in events)
    assert user_sides == every and item_sides == every
    slots = {keys.user_tag(f"u{n}") for n in range(37)} | {
        keys.item_tag(keys.item_shard(f"i{n}")) for n in range(53)
    }
    assert len(calls) == len({slot_of_tag(tag) for tag in slots})
