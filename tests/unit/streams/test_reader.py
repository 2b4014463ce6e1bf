"""Parsing a sequence as Redis gives it back (no redis-py callback): both reply shapes."""

from __future__ import annotations

from streamrank import keys
from streams.reader import SequenceEvent, parse_sequence


def test_parse_sequence_reads_pairs_and_flat_replies_alike() -> None:
    a = keys.sequence_member("e1", "i1", "drama")
    b = keys.sequence_member("e2", "i2", None)
    expected = [SequenceEvent("i1", "drama", 1_700_000_000_123, "e1"),
                SequenceEvent("i2", None, 1_700_000_000_456, "e2")]  # fmt: skip
    nested = [[a.encode(), 1_700_000_000_123.0], [b.encode(), 1_700_000_000_456.0]]  # RESP3
    flat = [a.encode(), b"1700000000123", b.encode(), b"1700000000456"]  # RESP2, no hiredis
    assert parse_sequence(nested) == expected
    assert parse_sequence(flat) == expected
    assert parse_sequence([]) == []
    assert expected[0].to_dict() == {
        "item_id": "i1", "category": "drama", "ts": 1_700_000_000_123, "event_id": "e1",
    }  # fmt: skip
