"""ItemEvents -> the item attribute table (``keys.item_attributes(shard)``), newest first.

``split_items`` takes a fetched batch's item records out (the features worker consumes the
``items`` topic beside ``clicks``); ``decode_items`` validates them (bad ones become dead
letters with a reason, as clicks do); ``ItemWriter.apply`` writes the valid ones with one Lua
script call per item shard (one slot each: cluster-safe), one round trip. Each value is the
item's JSON (:func:`streams.attributes.item_event_json`) with its event time under ``ts``; the
script replaces a stored value only with one at least as new, so a replayed event rewrites
the same bytes (idempotent) and an older event never overwrites a newer one, whatever order
the partitions are read in. A value from ``streamrank features load`` has no ``ts`` (it counts
as 0: any event replaces it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas import DeadLetter, ItemEvent, Limits, decode_item
from streamrank import keys
from streamrank.kafka.guard import UndecodableBatch
from streamrank.redis.errors import redis_call
from streamrank.redis.pipeline import ScriptCall, run_scripts
from streams.attributes import item_event_json
from streams.classify import Record, dead_letter, payload

# KEYS[1]: one shard's attribute hash. ARGV: item id, ts, value, repeated. Returns how many
# values were written (the others were older than the stored one).
WRITE_ITEMS_LUA = """
local written = 0
for j = 1, #ARGV, 3 do
  local ts = tonumber(ARGV[j + 1])
  local old = redis.call('HGET', KEYS[1], ARGV[j])
  local old_ts = 0
  if old then
    local ok, decoded = pcall(cjson.decode, old)
    if ok and type(decoded) == 'table' and tonumber(decoded['ts']) then
      old_ts = tonumber(decoded['ts'])
    end
  end
  if ts >= old_ts then
    redis.call('HSET', KEYS[1], ARGV[j], ARGV[j + 2])
    written = written + 1
  end
end
return written
"""


@dataclass(slots=True)
class DecodedItems:
    """One batch's item records: the valid events and the dead letters (reason, letter)."""

    events: list[ItemEvent] = field(default_factory=list)
    dead: list[tuple[str, DeadLetter]] = field(default_factory=list)
    skipped: int = 0  # offsets of undecodable record batches


def split_items(records: Sequence[Record], topic: str) -> tuple[list[Record], list[Record]]:
    """(the records of ``topic``, the others), each in batch order."""
    items = [r for r in records if r.topic == topic]
    if not items:
        return [], list(records)
    return items, [r for r in records if r.topic != topic]


def decode_items(records: Sequence[Record], *, limits: Limits, now_ms: int) -> DecodedItems:
    """Validate every item record; anything wrong dead-letters that record alone."""
    out = DecodedItems()
    for record in records:
        try:
            if isinstance(record.value, UndecodableBatch):
                out.skipped += record.value.last_offset - record.value.first_offset + 1
            out.events.append(decode_item(payload(record), limits))
        except Exception as exc:
            out.dead.append(dead_letter(record, exc, now_ms))
    return out


def item_calls(events: Sequence[ItemEvent]) -> list[ScriptCall]:
    """One script call per item shard touched (arguments in event order)."""
    by_shard: dict[int, list[Any]] = {}
    for event in events:
        by_shard.setdefault(keys.item_shard(event.item_id), []).extend(
            (event.item_id, event.ts, item_event_json(event))
        )
    return [
        ScriptCall(keys=[keys.item_attributes(shard)], args=args)
        for shard, args in sorted(by_shard.items())
    ]


class ItemWriter:
    """Writes ItemEvents into the item attribute table (see the module doc)."""

    def __init__(self, *, redis: Any) -> None:
        self._redis = redis
        self._script: Any = redis.register_script(WRITE_ITEMS_LUA)

    async def apply(self, events: Sequence[ItemEvent]) -> int:
        """Write ``events``; returns how many replaced (or created) a value. Raises
        RedisUnavailable when Redis does not answer (safe to retry: the writes are
        idempotent)."""
        calls = item_calls(events)
        if not calls:
            return 0
        with redis_call(
            "the item attribute write",
            "the batch will be retried; check that Redis is up and STREAMRANK_REDIS_URL is right",
        ):
            replies = await run_scripts(self._redis, self._script, calls)
        return sum(int(r) for r in replies)
