"""Offline attribute tables in Redis: users' (age, gender, ...) and items' (category).

``await write_attributes(redis, users={user: {name: value}}, items={item: {name: value}})``
writes ``keys.user_attributes(user)`` (a hash per user, in the user's slot: the scoring read
takes it with the sequence) and ``keys.item_attributes(shard)`` (a hash per item shard: field =
item id, value = the item's attributes as one JSON object). Plain ``HSET``s, so a load can be
run again (it overwrites, and adds what is new), pipelined one pipeline per node
(:class:`streamrank.redis.pipeline.NodePipeline`), in chunks of ``chunk`` users or items per
round trip. ``streamrank features load`` reads them from MovieLens files; the features worker
writes ItemEvents into the same item table (:mod:`streams.items`), and the scoring worker reads
the items its model version does not know with :func:`read_item_attributes` (cold start).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from schemas import ItemEvent
from streamrank import keys
from streamrank.redis.errors import redis_call
from streamrank.redis.pipeline import NodePipeline

CHUNK = 2000  # users or items per round trip
FIELDS_PER_HSET = 500  # item fields per HSET of one shard


def item_attributes_json(attributes: Mapping[str, Any]) -> bytes:
    """The value of one item in its shard's attribute hash (keys sorted: one byte form)."""
    return orjson.dumps(dict(attributes), option=orjson.OPT_SORT_KEYS)


def item_event_json(event: ItemEvent) -> bytes:
    """The value an ItemEvent writes: ``{"category", "attributes", "ts"}`` (streams.items)."""
    return item_attributes_json(
        {"category": event.category, "attributes": event.attributes, "ts": event.ts}
    )


async def write_attributes(
    redis: Any,
    *,
    users: Mapping[str, Mapping[str, str]],
    items: Mapping[str, Mapping[str, str]],
    user_prefix: str = "",
    chunk: int = CHUNK,
    progress: Callable[[int], object] | None = None,
) -> dict[str, int]:
    """Write the attribute tables; ``user_prefix`` is put before every user id (a replay's run
    id). ``progress(n)`` is called after each round trip with the users and items it wrote.
    Returns ``{"users", "items", "round_trips"}``; users or items without attributes are
    skipped. Raises RedisUnavailable when Redis does not answer (safe to run again)."""
    user_rows = [(f"{user_prefix}{u}", dict(a)) for u, a in users.items() if a]
    item_rows = [(i, item_attributes_json(a)) for i, a in items.items() if a]
    trips = 0
    for start in range(0, len(user_rows), chunk):
        pipe = NodePipeline(redis)
        part = user_rows[start : start + chunk]
        for user, attributes in part:
            key = keys.user_attributes(user)
            pipe.add(key, "HSET", key, *(x for pair in attributes.items() for x in pair))
        await _execute(pipe)
        trips += 1
        if progress is not None:
            progress(len(part))
    for start in range(0, len(item_rows), chunk):
        items_part = item_rows[start : start + chunk]
        by_shard: dict[int, list[Any]] = {}
        for item, value in items_part:
            by_shard.setdefault(keys.item_shard(item), []).extend((item, value))
        pipe = NodePipeline(redis)
        for shard, fields in by_shard.items():
            key = keys.item_attributes(shard)
            for at in range(0, len(fields), 2 * FIELDS_PER_HSET):
                pipe.add(key, "HSET", key, *fields[at : at + 2 * FIELDS_PER_HSET])
        await _execute(pipe)
        trips += 1
        if progress is not None:
            progress(len(items_part))
    return {"users": len(user_rows), "items": len(item_rows), "round_trips": trips}


async def _execute(pipe: NodePipeline) -> None:
    with redis_call(
        "the attribute load",
        "nothing is half-applied that a new run would not fix: run it again once Redis answers",
    ):
        await pipe.execute()


async def read_item_attributes(redis: Any, item_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The attribute value (parsed JSON object) of each of ``item_ids`` that has one: one
    ``HMGET`` per item shard, one round trip (one pipeline per node). Values that are not a JSON
    object are left out. Raises RedisUnavailable when Redis does not answer."""
    by_shard: dict[int, list[str]] = {}
    for item in dict.fromkeys(item_ids):
        by_shard.setdefault(keys.item_shard(item), []).append(item)
    if not by_shard:
        return {}
    pipe = NodePipeline(redis)
    for shard, items in by_shard.items():
        key = keys.item_attributes(shard)
        pipe.add(key, "HMGET", key, *items)
    with redis_call("the item attribute read", "retry later; unknown items get the OOV row"):
        replies = await pipe.execute()
    out: dict[str, dict[str, Any]] = {}
    for items, values in zip(by_shard.values(), replies, strict=True):
        for item, raw in zip(items, values, strict=True):
            if raw is None:
                continue
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict):
                out[item] = value
    return out
