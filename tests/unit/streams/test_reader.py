"""Parsing a sequence as Redis gives it back (no redis-py callback): both reply shapes, members
with and without the action, and the point-in-time cut."""

from __future__ import annotations

from streamrank import keys
from streams.batch_read import item_category, sequence_before
from streams.reader import SequenceEvent, parse_member, parse_sequence


def test_parse_sequence_reads_pairs_and_flat_replies_alike() -> None:
    a = keys.sequence_member("e1", "i1", "drama", "cart")
    b = keys.sequence_member("e2", "i2", None, "click")
    expected = [SequenceEvent("i1", "drama", 1_700_000_000_123, "e1", "cart"),
                SequenceEvent("i2", None, 1_700_000_000_456, "e2", "click")]  # fmt: skip
    nested = [[a.encode(), 1_700_000_000_123.0], [b.encode(), 1_700_000_000_456.0]]  # RESP3
    flat = [a.encode(), b"1700000000123", b.encode(), b"1700000000456"]  # RESP2, no hiredis
    assert parse_sequence(nested) == expected
    assert parse_sequence(flat) == expected
    assert parse_sequence([]) == []
    assert expected[0].to_dict() == {
        "item_id": "i1", "category": "drama", "ts": 1_700_000_000_123, "event_id": "e1",
        "action": "cart",
    }  # fmt: skip


def test_parse_member_reads_three_and_four_field_members() -> None:
    # written before the action was kept: three fields, action None
    assert parse_member(b"e1\x1fi1\x1fdrama", b"5") == SequenceEvent("i1", "drama", 5, "e1", None)
    assert parse_member("e1\x1fi1\x1f", 5.0) == SequenceEvent("i1", None, 5, "e1", None)
    # four fields; empty category or action read as None
    assert parse_member(b"e1\x1fi1\x1fdrama\x1fview", 7) == SequenceEvent(
        "i1", "drama", 7, "e1", "view"
    )
    assert parse_member("e1\x1fi1\x1f\x1f", 7) == SequenceEvent("i1", None, 7, "e1", None)
    assert parse_member(keys.sequence_member("e", "i", None, None), 1).action is None
    # ids may hold anything but control characters: a member round-trips whatever they hold
    member = keys.sequence_member("e:{x}", "i|y z", "Sci-Fi|Drama", "purchase")
    assert parse_member(member, 3) == SequenceEvent("i|y z", "Sci-Fi|Drama", 3, "e:{x}", "purchase")


def test_sequence_before_keeps_the_events_strictly_before_as_of() -> None:
    events = [SequenceEvent(f"i{k}", None, ts, f"e{k}") for k, ts in enumerate([10, 20, 20, 30])]
    assert sequence_before(events, 20) == events[:1]  # same ms as as_of: not known yet
    assert sequence_before(events, 21) == events[:3]
    assert sequence_before(events, 5) == []
    assert sequence_before(events, 31) == events
    assert sequence_before([], 100) == []


def test_item_category_reads_the_attribute_json() -> None:
    assert item_category("i", b'{"category": "Action|Comedy"}') == "Action|Comedy"
    assert item_category("i", None) is None
    assert item_category("i", b"{}") is None
    assert item_category("i", b'{"category": ""}') is None
    assert item_category("bad-json", b"not json") is None
    assert item_category("bad-type", b'{"category": 3}') is None
