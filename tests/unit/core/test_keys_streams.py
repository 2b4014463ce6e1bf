"""Byte-exact feature keys, and the property the cluster relies on: every key of one user, and
every key of one item shard, is in one hash slot, whatever the ids hold."""

import zlib

from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from streamrank import keys

# Ids as the message contract admits them: no control characters, braces and colons allowed.
ids = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40)


def slot(key: str) -> int:
    return int(key_slot(key.encode()))


def test_sequence_and_seen_keys_are_byte_exact() -> None:
    assert keys.sequence("u42") == "sr:{u:u42}:seq"
    assert keys.seen("u42", "ev-000017") == "sr:{u:u42}:seen:ev-000017"
    assert keys.user_tag("u42") == "{u:u42}"
    assert keys.user_keys_pattern("bench-1-*") == "sr:{u:bench-1-*}:*"


def test_counter_bucket_keys_are_byte_exact() -> None:
    assert keys.user_counter_bucket("u1", 300, 1_700_000_100) == "sr:{u:u1}:cnt:300:1700000100"
    assert keys.item_counter_bucket(7, 3600, 1_699_999_200) == "sr:{i:7}:cnt:3600:1699999200"
    assert keys.item_seen(7, "ev-1") == "sr:{i:7}:seen:ev-1"
    assert keys.item_keys_pattern("cnt") == "sr:{i:*}:cnt*"


def test_attribute_keys_are_byte_exact() -> None:
    assert keys.user_attributes("u42") == "sr:{u:u42}:attr"
    assert keys.item_attributes(7) == "sr:{i:7}:attr"


def test_item_shard_is_crc32_modulo_the_shard_count() -> None:
    # zlib's CRC-32 (IEEE): any language can compute the same shard
    assert keys.ITEM_COUNTER_SHARDS == 16
    for item in ("i9", "1682", "bench-abc-i123", "é"):
        assert keys.item_shard(item) == zlib.crc32(item.encode()) % 16


@given(ids, ids, st.integers(1, 10**6), st.integers(0, 2 * 10**9))
def test_every_key_of_one_user_shares_a_slot(user: str, event: str, res: int, start: int) -> None:
    home = slot(keys.sequence(user))
    assert slot(keys.seen(user, event)) == home
    assert slot(keys.user_counter_bucket(user, res, start)) == home
    assert slot(keys.user_attributes(user)) == home
    assert slot(keys.user_tag(user)) == home  # what the writer groups by


@given(ids, ids, st.integers(1, 10**6), st.integers(0, 2 * 10**9))
def test_an_items_counters_and_markers_share_its_shards_slot(
    item: str, event: str, res: int, start: int
) -> None:
    shard = keys.item_shard(item)
    home = slot(keys.item_tag(shard))
    assert slot(keys.item_counter_bucket(shard, res, start)) == home
    assert slot(keys.item_seen(shard, event)) == home
    assert slot(keys.item_attributes(shard)) == home


def test_item_shards_spread_over_distinct_slots() -> None:
    slots = {slot(keys.item_tag(s)) for s in range(keys.ITEM_COUNTER_SHARDS)}
    assert len(slots) == keys.ITEM_COUNTER_SHARDS


def test_sequence_member_and_category_field() -> None:
    assert keys.sequence_member("e1", "i9", "drama", "cart") == "e1\x1fi9\x1fdrama\x1fcart"
    assert keys.sequence_member("e1", "i9", None, None) == "e1\x1fi9\x1f\x1f"
    assert keys.sequence_member("e1", "i9", "drama") == "e1\x1fi9\x1fdrama\x1f"
    assert keys.category_field("sci-fi") == "c:sci-fi"


def test_member_order_matches_event_id_string_order() -> None:
    ids = ["a", "a1", "a10", "a2", "b", "00009", "00010"]
    members = sorted(keys.sequence_member(i, "x", "c").encode() for i in ids)
    assert [m.split(b"\x1f")[0].decode() for m in members] == sorted(ids)


def test_group_registry_key_is_byte_exact_and_has_its_own_tag() -> None:
    assert keys.group_members("streamrank-scoring") == "sr:{grp:streamrank-scoring}:members"
    # the tag is the group: one registry key per group, spread over slots like any other
    assert slot(keys.group_members("g1")) == slot("{grp:g1}")


def test_event_id_sets_are_byte_exact_and_in_the_slot_they_name() -> None:
    assert keys.slot_tag(0) == "{s:5630}"  # the smallest n whose "s:<n>" lands in slot 0
    assert keys.event_ids(0, 3_750_000) == "sr:{s:5630}:ids:3750000"
    assert keys.event_ids_pattern() == "sr:{s:*}:ids:*"
    assert all(slot(keys.event_ids(s, 1)) == s for s in range(keys.CLUSTER_SLOTS))
    assert len({keys.slot_tag(s) for s in range(keys.CLUSTER_SLOTS)}) == keys.CLUSTER_SLOTS


@given(ids)
def test_a_users_slot_group_keys_share_the_users_slot(user: str) -> None:
    home = slot(keys.sequence(user))
    assert slot(keys.event_ids(slot(keys.user_tag(user)), 7)) == home
