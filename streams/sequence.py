"""A user's behaviour sequence as the scoring side reads it: :class:`SequenceEvent` and the
parsers of the sorted-set members (:func:`streamrank.keys.sequence_member`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from streamrank import keys


class SequenceEvent(NamedTuple):
    """One event of a user's behaviour sequence (a tuple: the scoring worker builds one per
    event of every request, and a tuple is the cheapest record to build)."""

    item_id: str
    category: str | None
    ts: int  # epoch ms
    event_id: str
    action: str | None = None  # None: not recorded (members written before actions were kept)

    def to_dict(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "category": self.category,
            "ts": self.ts,
            "event_id": self.event_id,
            "action": self.action,
        }


def parse_member(member: bytes | str, score: float | bytes) -> SequenceEvent:
    """Inverse of ``keys.sequence_member``: four fields, or three (no action) in members
    written before the action was kept."""
    text = member.decode() if isinstance(member, bytes) else member
    parts = text.split(keys.FIELD_SEP, 3)
    if len(parts) == 4:
        event_id, item_id, category, action = parts
        return SequenceEvent(item_id, category or None, int(float(score)), event_id, action or None)
    event_id, item_id, category = parts
    return SequenceEvent(item_id, category or None, int(float(score)), event_id)


def parse_sequence(reply: Sequence[Any]) -> list[SequenceEvent]:
    """A ``ZRANGE ... WITHSCORES`` reply as the parser gives it without redis-py's callback:
    ``[[member, score], ...]`` (RESP3 or hiredis) or flat ``[member, score, ...]`` (RESP2, and
    a Lua script's reply)."""
    if reply and not isinstance(reply[0], bytes | str):
        return [parse_member(member, score) for member, score in reply]
    pairs = iter(reply)
    return [parse_member(member, score) for member, score in zip(pairs, pairs, strict=True)]
