"""Point-in-time features of a whole scoring batch in one Redis round trip.

``FeatureReader.read_batch(queries, counters=..., attributes=...)`` (:mod:`streams.reader`)
answers one :class:`FeatureQuery` (user, as-of time, candidates) per request with a
:class:`RequestFeatures`. Everything is read "as of" the query's time: the sequence keeps the
events with ``ts < as_of_ms``, and each window sums the buckets of
:func:`streams.windows.closed_range` (closed buckets only), the definition the offline
training code uses.

Without counters and attributes the read is one ``ZRANGE`` per distinct user, as
``get_sequences``. Otherwise every read is a call of one Lua script (:data:`READ_LUA`), each
in one hash slot: one per (distinct user, window group) that returns the user's sequence (on
the user's first call), 1 h and 24 h clicks, 24 h clicks per category and attributes; and one
per (item shard, window group) that returns per item its 1 h and 24 h clicks and attribute
JSON. A window group is the pair of closed ranges of an as-of time: the requests of one batch
usually share it (their times are milliseconds apart), replays may not. The calls go out as
one pipeline per node, the nodes concurrently (:func:`streamrank.redis.pipeline.run_scripts`):
one round trip, the script loaded again on ``NOSCRIPT``.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from streamrank import keys
from streamrank.redis.errors import redis_call
from streamrank.redis.pipeline import NodePipeline, ScriptCall, run_scripts
from streams.sequence import SequenceEvent, parse_sequence
from streams.windows import Window, closed_buckets, closed_range

logger = logging.getLogger(__name__)

# KEYS: a user call: [sequence] [attributes] fine buckets, coarse buckets; an item call:
# [attributes] fine buckets, coarse buckets. ARGV: kind ('u' or 'i'), with sequence ('1'/'0'),
# with attributes, fine bucket count, coarse bucket count, then (item calls) the item ids.
# A user call returns {sequence (flat ZRANGE WITHSCORES), clicks 1h, clicks 24h, flat
# [category, clicks 24h, ...], flat HGETALL of the attributes}; an item call returns per item
# clicks 1h, clicks 24h, attribute JSON (or nil), flat.
READ_LUA = """
local kind, with_seq, with_attr = ARGV[1], ARGV[2] == '1', ARGV[3] == '1'
local nf, nc = tonumber(ARGV[4]), tonumber(ARGV[5])
local k = 0
if kind == 'u' then
  local seq, attrs = {}, {}
  if with_seq then k = k + 1; seq = redis.call('ZRANGE', KEYS[k], 0, -1, 'WITHSCORES') end
  if with_attr then k = k + 1; attrs = redis.call('HGETALL', KEYS[k]) end
  local n1, n24 = 0, 0
  for j = k + 1, k + nf do
    n1 = n1 + (tonumber(redis.call('HGET', KEYS[j], 'n')) or 0)
  end
  local per, order = {}, {}
  for j = k + nf + 1, k + nf + nc do
    local h = redis.call('HGETALL', KEYS[j])
    for f = 1, #h, 2 do
      local name, v = h[f], tonumber(h[f + 1])
      if name == 'n' then
        n24 = n24 + v
      elseif string.sub(name, 1, 2) == 'c:' then
        local c = string.sub(name, 3)
        if per[c] then per[c] = per[c] + v else per[c] = v; order[#order + 1] = c end
      end
    end
  end
  local cats = {}
  for _, c in ipairs(order) do cats[#cats + 1] = c; cats[#cats + 1] = per[c] end
  return {seq, n1, n24, cats, attrs}
end
local n = #ARGV - 5
local out = {}
for j = 1, n do out[3 * j - 2] = 0; out[3 * j - 1] = 0; out[3 * j] = false end
local function each(key, apply)
  for s = 1, n, 4000 do
    local r = redis.call('HMGET', key, unpack(ARGV, 5 + s, 5 + math.min(s + 3999, n)))
    for t = 1, #r do
      if r[t] then apply(s + t - 1, r[t]) end
    end
  end
end
if with_attr then k = 1; each(KEYS[1], function(j, v) out[3 * j] = v end) end
for j = k + 1, k + nf do
  each(KEYS[j], function(i, v) out[3 * i - 2] = out[3 * i - 2] + tonumber(v) end)
end
for j = k + nf + 1, k + nf + nc do
  each(KEYS[j], function(i, v) out[3 * i - 1] = out[3 * i - 1] + tonumber(v) end)
end
return out
"""


class FeatureQuery(NamedTuple):
    """One request's read: its user, its as-of time (epoch ms) and its candidates."""

    user_id: str
    as_of_ms: int
    items: Sequence[str]


@dataclass(frozen=True, slots=True)
class UserFeatures:
    """A user's features as of a query's time. The dicts may be shared by the queries of one
    user in a batch: read them, do not change them."""

    sequence: list[SequenceEvent]  # events with ts < as_of_ms, oldest first ((ts, event_id))
    clicks_1h: int
    clicks_24h: int
    categories_24h: dict[str, int]
    attributes: dict[str, str]


@dataclass(frozen=True, slots=True)
class ItemFeatures:
    """A candidate's features as of a query's time."""

    clicks_1h: int
    clicks_24h: int
    category: str | None  # from the item attribute table; None when unknown


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What one query reads: its user's features and its candidates', aligned with its items."""

    user: UserFeatures
    items: list[ItemFeatures]


NO_ITEM_FEATURES = ItemFeatures(0, 0, None)
_WARN_LIMIT = 100  # distinct items whose unreadable attributes are logged, per process
_warned: set[str] = set()


def sequence_before(events: list[SequenceEvent], as_of_ms: int) -> list[SequenceEvent]:
    """The events with ``ts < as_of_ms`` of a sequence in (ts, event_id) order: a prefix."""
    return events[: bisect_left(events, as_of_ms, key=_ts)]


def _ts(event: SequenceEvent) -> int:
    return event.ts


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: Sequence[Any]) -> list[tuple[str, Any]]:
    it = iter(flat)
    return [(_text(name), value) for name, value in zip(it, it, strict=True)]


_PARSED: dict[Any, str | None] = {}  # attribute JSON -> its category (few distinct values)
_PARSED_LIMIT = 100_000


def item_category(item_id: str, raw: Any) -> str | None:
    """The ``category`` of an item's attribute JSON; None when absent. A value that is not a
    JSON object with a string category is logged (once per item, for the first items) and
    read as unknown: one bad row must not fail every request that ranks the item."""
    if raw is None:
        return None
    known = _PARSED.get(raw, _PARSED)
    if known is not _PARSED:
        return known  # type: ignore[return-value]
    category = _parse_category(item_id, raw)
    if len(_PARSED) >= _PARSED_LIMIT:
        _PARSED.clear()
    _PARSED[raw] = category
    return category


def _parse_category(item_id: str, raw: Any) -> str | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        category = value.get("category")
        if category is None or isinstance(category, str):
            return category or None
    if item_id not in _warned and len(_warned) < _WARN_LIMIT:
        _warned.add(item_id)
        logger.warning(
            "item %r: its attributes in %s are not a JSON object with a string category (%r); "
            "read as unknown: reload them with `streamrank features load`",
            item_id,
            keys.item_attributes(keys.item_shard(item_id)),
            raw[:80],
        )
    return None


class ItemCache:
    """Candidates' features read recently, per window group, for ``ttl_s`` seconds: a hot item
    is read from Redis once per ``ttl_s`` per process, not once per batch. Its counts are then
    at most ``ttl_s`` old: a click applied in that time (a late one, into a bucket that had
    closed) shows from the next read on. ``ttl_s`` 0 turns the cache off."""

    def __init__(self, ttl_s: float, *, max_entries: int = 200_000, clock: Any = None) -> None:
        self.ttl_s = ttl_s
        self._max = max_entries
        self._clock = clock or time.monotonic
        self._entries: dict[tuple[str, Any], tuple[float, ItemFeatures]] = {}

    def get(self, item: str, group: Any, now: float) -> ItemFeatures | None:
        found = self._entries.get((item, group))
        if found is None or now - found[0] > self.ttl_s:
            return None
        return found[1]

    def put(self, item: str, group: Any, features: ItemFeatures, now: float) -> None:
        if len(self._entries) >= self._max:
            self._entries.clear()  # window groups roll over every few minutes anyway
        self._entries[(item, group)] = (now, features)

    def now(self) -> float:
        return float(self._clock())


@dataclass(slots=True)
class _ItemCall:
    """One item call being planned: its position among the calls and its items' positions."""

    index: int
    items: dict[str, int] = field(default_factory=dict)


class BatchPlan:
    """The script calls of one batch and where each query finds its replies (pure: built
    from the queries and the windows, no I/O)."""

    def __init__(
        self,
        queries: Sequence[FeatureQuery],
        windows: tuple[Window, Window],
        *,
        counters: bool,
        attributes: bool,
        cache: ItemCache | None = None,
    ) -> None:
        self.calls: list[ScriptCall] = []
        self._cache = cache if cache is not None and cache.ttl_s > 0 else None
        self._now = self._cache.now() if self._cache is not None else 0.0
        self._windows = windows
        self._counters = counters
        self._attributes = attributes
        self._user_calls: dict[tuple[str, Any], int] = {}
        self._first_call: dict[str, int] = {}  # user -> the call reading its sequence
        self._item_calls: dict[tuple[int, Any], _ItemCall] = {}
        self._call_groups: dict[int, Any] = {}  # item call index -> its window group
        self._item_refs: dict[Any, dict[str, tuple[_ItemCall, int] | ItemFeatures]] = {}
        # per query: its user call, and per candidate (its item call, position) or a cached read
        self.refs: list[tuple[int, list[tuple[_ItemCall, int] | ItemFeatures]]] = []
        for query in queries:
            group = self._group(query.as_of_ms)
            user_call = self._user_call(query.user_id, group, query.as_of_ms)
            known = self._item_refs.setdefault(group, {})  # item -> its ref, in this group
            items = []
            for item in query.items:
                ref = known.get(item)
                if ref is None:
                    cached = (
                        None
                        if self._cache is None
                        else self._cache.get(item, (group, attributes), self._now)
                    )
                    ref = known[item] = (
                        cached
                        if cached is not None
                        else self._item_ref(item, group, query.as_of_ms)
                    )
                items.append(ref)
            self.refs.append((user_call, items))
        for call in self._item_calls.values():  # the item ids close each item call's ARGV
            self.calls[call.index] = ScriptCall(
                keys=self.calls[call.index].keys,
                args=(*self.calls[call.index].args, *call.items),
            )

    def _group(self, as_of_ms: int) -> Any:
        if not self._counters:
            return None
        fine, coarse = self._windows
        return closed_range(as_of_ms, fine)[1], closed_range(as_of_ms, coarse)[1]

    def _buckets(self, as_of_ms: int) -> tuple[range, range]:
        if not self._counters:
            return range(0), range(0)
        fine, coarse = self._windows
        return closed_buckets(as_of_ms, fine), closed_buckets(as_of_ms, coarse)

    def _user_call(self, user: str, group: Any, as_of_ms: int) -> int:
        index = self._user_calls.get((user, group))
        if index is not None:
            return index
        index = self._user_calls[(user, group)] = len(self.calls)
        first = user not in self._first_call
        if first:
            self._first_call[user] = index
        with_attr = first and self._attributes
        fine, coarse = self._windows
        fine_starts, coarse_starts = self._buckets(as_of_ms)
        call_keys = [keys.sequence(user)] if first else []
        if with_attr:
            call_keys.append(keys.user_attributes(user))
        call_keys += keys.user_counter_buckets(user, fine.resolution_s, fine_starts)
        call_keys += keys.user_counter_buckets(user, coarse.resolution_s, coarse_starts)
        args = ("u", "1" if first else "0", "1" if with_attr else "0")
        self.calls.append(
            ScriptCall(
                keys=call_keys,
                args=(*args, len(fine_starts), len(coarse_starts)),
                route=keys.sequence(user),
            )
        )
        return index

    def _item_ref(self, item: str, group: Any, as_of_ms: int) -> tuple[_ItemCall, int]:
        """A new item of ``group``: its shard's call (created on first use) and position."""
        shard = keys.item_shard(item)
        call = self._item_calls.get((shard, group))
        if call is None:
            call = self._item_calls[(shard, group)] = _ItemCall(len(self.calls))
            self._call_groups[call.index] = group
            fine, coarse = self._windows
            fine_starts, coarse_starts = self._buckets(as_of_ms)
            call_keys = [keys.item_attributes(shard)] if self._attributes else []
            call_keys += keys.item_counter_buckets(shard, fine.resolution_s, fine_starts)
            call_keys += keys.item_counter_buckets(shard, coarse.resolution_s, coarse_starts)
            args = ("i", "0", "1" if self._attributes else "0")
            self.calls.append(
                ScriptCall(
                    keys=call_keys,
                    args=(*args, len(fine_starts), len(coarse_starts)),
                    route=keys.item_attributes(shard),
                )
            )
        position = call.items[item] = len(call.items)
        return call, position

    def results(
        self, queries: Sequence[FeatureQuery], replies: Sequence[Any]
    ) -> list[RequestFeatures]:
        """Each query's features from the calls' replies (in call order)."""
        first = self._first_call
        sequences = {user: parse_sequence(replies[index][0]) for user, index in first.items()}
        attrs = {user: {k: _text(v) for k, v in _pairs(replies[i][4])} for user, i in first.items()}
        counts: dict[int, tuple[int, int, dict[str, int]]] = {}
        items: dict[int, list[ItemFeatures]] = {}
        out = []
        for query, (user_call, refs) in zip(queries, self.refs, strict=True):
            user = counts.get(user_call)
            if user is None:
                _seq, n1, n24, categories, _attrs = replies[user_call]
                per = dict(sorted((name, int(v)) for name, v in _pairs(categories)))
                user = counts[user_call] = (int(n1), int(n24), per)
            found = []
            for ref in refs:
                if isinstance(ref, ItemFeatures):
                    found.append(ref)
                    continue
                call, position = ref
                parsed = items.get(call.index)
                if parsed is None:
                    parsed = items[call.index] = self._parsed(call, replies[call.index])
                found.append(parsed[position])
            seq = sequence_before(sequences[query.user_id], query.as_of_ms)
            features = UserFeatures(seq, user[0], user[1], user[2], attrs[query.user_id])
            out.append(RequestFeatures(features, found))
        return out

    def _parsed(self, call: _ItemCall, reply: Sequence[Any]) -> list[ItemFeatures]:
        """An item call's features, remembered in the cache."""
        parsed = _items(call, reply)
        if self._cache is not None:
            group = self._call_groups[call.index]
            for item, features in zip(call.items, parsed, strict=True):
                self._cache.put(item, (group, self._attributes), features, self._now)
        return parsed


def _items(call: _ItemCall, reply: Sequence[Any]) -> list[ItemFeatures]:
    """An item call's flat reply (clicks 1h, clicks 24h, attribute JSON per item) as
    ItemFeatures, in the call's item order."""
    return [
        ItemFeatures(
            int(reply[3 * n]), int(reply[3 * n + 1]), item_category(item, reply[3 * n + 2])
        )
        for n, item in enumerate(call.items)
    ]


async def read_batch(
    redis: Any,
    script: Any,
    windows: tuple[Window, Window],
    queries: Sequence[FeatureQuery],
    *,
    counters: bool,
    attributes: bool,
    cache: ItemCache | None = None,
) -> list[RequestFeatures]:
    """The features of each query, aligned with ``queries`` (see the module doc); one round
    trip. Raises RedisUnavailable when Redis does not answer."""
    if not queries:
        return []
    if not (counters or attributes):
        return await _sequences_only(redis, queries)
    plan = BatchPlan(queries, windows, counters=counters, attributes=attributes, cache=cache)
    with redis_call("the feature read", "retry later or serve without features"):
        replies = await run_scripts(redis, script, plan.calls)
    return plan.results(queries, replies)


async def read_sequences(redis: Any, user_ids: Sequence[str]) -> dict[str, list[SequenceEvent]]:
    """Each user's whole stored sequence, oldest first: one ZRANGE per distinct user, one
    round trip. Without redis-py's ``withscores`` option, whose callback would rebuild every
    pair (docs/benchmarks.md)."""
    users = list(dict.fromkeys(user_ids))
    if not users:
        return {}
    pipe = NodePipeline(redis)
    for user in users:
        key = keys.sequence(user)
        pipe.add(key, "ZRANGE", key, 0, -1, "WITHSCORES")
    with redis_call("the feature read", "retry later or serve without features"):
        replies = await pipe.execute()
    return {user: parse_sequence(r) for user, r in zip(users, replies, strict=True)}


async def _sequences_only(redis: Any, queries: Sequence[FeatureQuery]) -> list[RequestFeatures]:
    """The sequences alone: what ``get_sequences`` costs."""
    sequences = await read_sequences(redis, [q.user_id for q in queries])
    return [
        RequestFeatures(
            UserFeatures(sequence_before(sequences[q.user_id], q.as_of_ms), 0, 0, {}, {}),
            [NO_ITEM_FEATURES] * len(q.items),
        )
        for q in queries
    ]
