"""Item records: split from the clicks, validated into events or dead letters, grouped by shard."""

from __future__ import annotations

import orjson

from schemas import DEFAULT_LIMITS, ItemEvent
from streamrank import keys
from streams.attributes import item_event_json
from streams.classify import Record
from streams.items import decode_items, item_calls, split_items


def record(value: bytes | None, offset: int = 0, topic: str = "items") -> Record:
    return Record(topic, 0, offset, b"k", value)


def test_item_records_are_split_from_the_clicks_in_order() -> None:
    batch = [record(b"1", 0), record(b"c", 1, "clicks"), record(b"2", 2)]
    items, clicks = split_items(batch, "items")
    assert [r.offset for r in items] == [0, 2] and [r.offset for r in clicks] == [1]
    assert split_items(clicks, "items") == ([], clicks)


def test_bad_item_records_become_dead_letters_with_their_reason() -> None:
    good = orjson.dumps({"item_id": "m1", "category": "Drama", "ts": 5})
    batch = [record(good), record(b"{", 1), record(None, 2),
             record(orjson.dumps({"item_id": "m2", "ts": 5, "attributes": {"g": 1}}), 3)]  # fmt: skip
    decoded = decode_items(batch, limits=DEFAULT_LIMITS, now_ms=9)
    assert decoded.events == [ItemEvent("m1", "Drama", 5)]
    assert [reason for reason, _ in decoded.dead] == ["not_json", "empty", "bad_type"]
    letter = decoded.dead[2][1]
    assert letter.source_topic == "items" and letter.offset == 3 and letter.at == 9


def test_one_script_call_per_item_shard_with_each_event_json() -> None:
    events = [ItemEvent(f"m{i}", "Drama", i, {"genres": ("Drama",)}) for i in range(40)]
    calls = item_calls(events)
    shards = {keys.item_shard(e.item_id) for e in events}
    assert len(calls) == len(shards)
    for call in calls:
        assert len(call.keys) == 1
        items = call.args[0::3]
        assert {keys.item_attributes(keys.item_shard(i)) for i in items} == set(call.keys)
    first = next(c for c in calls if "m0" in c.args[0::3])
    at = first.args.index("m0")
    assert first.args[at + 1] == 0 and first.args[at + 2] == item_event_json(events[0])
    assert orjson.loads(item_event_json(events[0])) == {
        "attributes": {"genres": ["Drama"]}, "category": "Drama", "ts": 0,
    }  # fmt: skip
