"""The read API of the features for the scoring side: whole batches in one Redis round trip.

``FeatureReader(*, redis, features)`` (``features``: the features settings):

- ``await read_batch(queries, counters=..., attributes=...)`` -> one ``RequestFeatures`` per
  ``FeatureQuery(user_id, as_of_ms, items)``: the user's sequence before ``as_of_ms``, counters
  and attributes, and each candidate's counters and category, all as of the query's time
  (:mod:`streams.batch_read`).
- ``await get_sequences(user_ids)`` -> ``{user_id: [SequenceEvent, ...]}`` oldest first, ordered
  by (ts, event_id), at most ``sequence_length`` events; an unknown user maps to ``[]``.
- ``await get_counters(user_ids=..., item_ids=..., at_ms=None)`` -> ``{"users": {user_id:
  {"clicks_1h", "clicks_24h", "categories_24h": {category: n}}}, "items": {item_id:
  {"clicks_1h", "clicks_24h"}}}``, as of ``at_ms`` (default: now).
- ``await item_popularity(item_ids)`` -> int64 array of 24 h clicks, aligned with ``item_ids``.
- ``await item_attributes(item_ids)`` -> ``{item_id: attribute JSON object}`` for the items
  that have one in the item attribute table.

Windows are point in time: the closed buckets of :func:`streams.windows.closed_range`, so no
event at or after the as-of time is counted. Each read is one pipeline per Redis node
(:class:`streamrank.redis.pipeline.NodePipeline`): on a cluster the nodes are read
concurrently, so a batch still costs one round trip of wall time. Item counters are read per
item shard (:func:`streamrank.keys.item_shard`): one ``HMGET`` per (shard, bucket) for the
items of that shard.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamrank import clock, keys
from streamrank.redis.client import redis_client
from streamrank.redis.errors import redis_call
from streamrank.redis.pipeline import NodePipeline
from streamrank.settings import FeatureSettings, Settings
from streams.attributes import read_item_attributes
from streams.batch_read import (
    READ_LUA,
    FeatureQuery,
    ItemCache,
    ItemFeatures,
    RequestFeatures,
    UserFeatures,
    read_batch,
    read_sequences,
)
from streams.sequence import SequenceEvent, parse_member, parse_sequence
from streams.windows import Window, closed_buckets, windows_from_settings

__all__ = [
    "FeatureQuery",
    "FeatureReader",
    "ItemFeatures",
    "RequestFeatures",
    "SequenceEvent",
    "UserFeatures",
    "parse_member",
    "parse_sequence",
    "read_user_features",
]

_CATEGORY_PREFIX = keys.category_field("")


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


class FeatureReader:
    """Batch reads of sequences and windowed counters."""

    def __init__(self, *, redis: Any, features: FeatureSettings) -> None:
        self._redis = redis
        self._fine, self._coarse = windows_from_settings(features)
        self._script: Any = redis.register_script(READ_LUA)
        self._items = ItemCache(features.item_cache_s)

    async def read_batch(
        self, queries: Sequence[FeatureQuery], *, counters: bool, attributes: bool
    ) -> list[RequestFeatures]:
        """Each query's features as of its time, aligned with ``queries``, in one round trip
        (:mod:`streams.batch_read`). Without ``counters`` the counts are 0; without
        ``attributes`` the attributes are ``{}`` and the categories None."""
        return await read_batch(
            self._redis,
            self._script,
            (self._fine, self._coarse),
            queries,
            counters=counters,
            attributes=attributes,
            cache=self._items,
        )

    async def item_attributes(self, item_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each item's attribute value (a JSON object) from the item attribute table, for the
        items that have one (one round trip)."""
        return await read_item_attributes(self._redis, item_ids)

    async def _run(self, pipe: NodePipeline) -> list[Any]:
        with redis_call("the feature read", "retry later or serve without features"):
            return await pipe.execute()

    async def get_sequences(self, user_ids: Iterable[str]) -> dict[str, list[SequenceEvent]]:
        """Each user's sequence, oldest first (one round trip for all users)."""
        return await read_sequences(self._redis, list(user_ids))

    async def get_counters(
        self,
        *,
        user_ids: Iterable[str] = (),
        item_ids: Iterable[str] = (),
        at_ms: int | None = None,
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """Windowed counters of users and items as of ``at_ms`` (default now): the closed
        buckets of :func:`streams.windows.closed_range` (one round trip)."""
        now_ms = clock.now_ms() if at_ms is None else at_ms
        users = list(dict.fromkeys(user_ids))
        items = list(dict.fromkeys(item_ids))
        fine_buckets = list(closed_buckets(now_ms, self._fine))
        coarse_buckets = list(closed_buckets(now_ms, self._coarse))
        pipe = NodePipeline(self._redis)
        for user in users:
            for start in fine_buckets:
                key = keys.user_counter_bucket(user, self._fine.resolution_s, start)
                pipe.add(key, "HGET", key, "n")
            for start in coarse_buckets:
                key = keys.user_counter_bucket(user, self._coarse.resolution_s, start)
                pipe.add(key, "HGETALL", key)
        fine_reads = self._queue_item_reads(pipe, items, fine_buckets, self._fine)
        coarse_reads = self._queue_item_reads(pipe, items, coarse_buckets, self._coarse)
        replies = await self._run(pipe)
        result: dict[str, dict[str, dict[str, Any]]] = {"users": {}, "items": {}}
        pos = 0
        for user in users:
            clicks_1h = sum(_int(v) for v in replies[pos : pos + len(fine_buckets)])
            pos += len(fine_buckets)
            clicks_24h = 0
            categories: dict[str, int] = {}
            for reply in replies[pos : pos + len(coarse_buckets)]:
                for raw_field, raw_value in reply.items():
                    name = raw_field.decode()
                    if name == "n":
                        clicks_24h += int(raw_value)
                    elif name.startswith(_CATEGORY_PREFIX):
                        cat = name[len(_CATEGORY_PREFIX) :]
                        categories[cat] = categories.get(cat, 0) + int(raw_value)
            pos += len(coarse_buckets)
            result["users"][user] = {
                "clicks_1h": clicks_1h,
                "clicks_24h": clicks_24h,
                "categories_24h": dict(sorted(categories.items())),
            }
        if items:
            fine = fine_reads.totals(replies[pos : pos + len(fine_reads)])
            pos += len(fine_reads)
            coarse = coarse_reads.totals(replies[pos : pos + len(coarse_reads)])
            for index, item in enumerate(items):
                result["items"][item] = {
                    "clicks_1h": int(fine[index]),
                    "clicks_24h": int(coarse[index]),
                }
        return result

    async def item_popularity(
        self, item_ids: Sequence[str], *, at_ms: int | None = None
    ) -> np.ndarray:
        """24 h clicks of each item as of ``at_ms`` (default now; closed buckets, as
        :meth:`get_counters`): int64, aligned with ``item_ids`` (ids may repeat)."""
        if not len(item_ids):
            return np.zeros(0, dtype=np.int64)
        now_ms = clock.now_ms() if at_ms is None else at_ms
        buckets = list(closed_buckets(now_ms, self._coarse))
        pipe = NodePipeline(self._redis)
        reads = self._queue_item_reads(pipe, list(item_ids), buckets, self._coarse)
        return reads.totals(await self._run(pipe))

    @staticmethod
    def _queue_item_reads(
        pipe: NodePipeline, items: list[str], buckets: Sequence[int], window: Window
    ) -> ItemReads:
        """One HMGET per (item shard, bucket) for the shard's items; see :class:`ItemReads`."""
        by_shard: dict[int, list[int]] = {}
        for position, item in enumerate(items):
            by_shard.setdefault(keys.item_shard(item), []).append(position)
        reads = ItemReads(width=len(items))
        for shard, positions in by_shard.items():
            fields = [items[p] for p in positions]
            for start in buckets:
                key = keys.item_counter_bucket(shard, window.resolution_s, start)
                pipe.add(key, "HMGET", key, *fields)
                reads.positions.append(positions)
        return reads


@dataclass(slots=True)
class ItemReads:
    """Where the replies of queued item-counter HMGETs go: ``positions[k]`` = the positions
    (in the requested item list) of the fields of the k-th HMGET."""

    width: int
    positions: list[list[int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.positions)

    def totals(self, replies: list[list[Any]]) -> np.ndarray:
        """Per requested item, the sum of its fields over the replies (None = 0); ``int64``."""
        totals = np.zeros(self.width, dtype=np.int64)
        for positions, reply in zip(self.positions, replies, strict=True):
            totals[positions] += np.array([_int(v) for v in reply], dtype=np.int64)
        return totals


async def read_user_features(
    settings: Settings, user_id: str, *, as_of_ms: int | None = None, redis: Any = None
) -> dict[str, Any]:
    """``{"user_id", "as_of", "sequence": [...] (oldest first), "counters": {...},
    "attributes": {...}}`` of one user as of ``as_of_ms`` (default now): the events before
    it, the closed windows; through ``redis`` (default: a client opened for this call)."""
    as_of = clock.now_ms() if as_of_ms is None else as_of_ms
    client = redis_client(settings.redis) if redis is None else redis
    try:
        reader = FeatureReader(redis=client, features=settings.features)
        query = FeatureQuery(user_id, as_of, ())
        (found,) = await reader.read_batch([query], counters=True, attributes=True)
    finally:
        if redis is None:
            await client.aclose()
    user = found.user
    return {
        "user_id": user_id,
        "as_of": as_of,
        "sequence": [event.to_dict() for event in user.sequence],
        "counters": {
            "clicks_1h": user.clicks_1h,
            "clicks_24h": user.clicks_24h,
            "categories_24h": user.categories_24h,
        },
        "attributes": user.attributes,
    }
