from streamrank import keys


def test_sequence_and_seen_keys_are_byte_exact() -> None:
    assert keys.sequence("u42") == "sr:seq:u42"
    assert keys.seen("ev-000017") == "sr:seen:ev-000017"


def test_counter_bucket_keys_are_byte_exact() -> None:
    assert keys.user_counter_bucket("u1", 300, 1_700_000_100) == "sr:cnt:u:u1:300:1700000100"
    assert keys.item_counter_bucket(3600, 1_699_999_200) == "sr:cnt:i:3600:1699999200"


def test_sequence_member_and_category_field() -> None:
    assert keys.sequence_member("e1", "i9", "drama") == "e1\x1fi9\x1fdrama"
    assert keys.sequence_member("e1", "i9", None) == "e1\x1fi9\x1f"
    assert keys.category_field("sci-fi") == "c:sci-fi"


def test_member_order_matches_event_id_string_order() -> None:
    ids = ["a", "a1", "a10", "a2", "b", "00009", "00010"]
    members = sorted(keys.sequence_member(i, "x", "c").encode() for i in ids)
    assert [m.split(b"\x1f")[0].decode() for m in members] == sorted(ids)
