"""The ``id_sets`` write contract: one script call per slot group, replays and duplicate event
ids found by the group's set of applied event ids, counter increments summed in the worker.

An entry is one event's effects inside one slot group: its user side (sequence member, user
counters), its item side (item counters), or both when the two share the group (always on a
single server). Each call of :data:`APPLY_SETS_LUA`

1. looks up every entry's ``user_id \\x1f event_id`` in the group's id sets of this dedupe
   generation and the one before (``SMISMEMBER``: one command per set, not one per event);
2. when none is there (every batch but replays and producer duplicates) applies the batch's
   effects as the worker summed them: per user one ZADD + ZREMRANGEBYRANK + PEXPIRE, per
   (bucket, field) one HINCRBY with the batch's sum, and PEXPIREAT on a bucket only when this
   call created it (a bucket's expiry never changes);
3. otherwise decodes the per-entry detail (its second argument, untouched on the fast path)
   and leaves out the entries found: their members and their share of each sum;
4. adds the ids to this generation's set (SADD) and sets its expiry.

Redis runs each call atomically and each call stays in one slot, so a replay, a retry of any
subset of a batch's calls, or a producer's duplicate applies exactly the entries not applied
before, and batches commute (so two may be in flight). No state is kept per partition or
offset: a rebalance, an offset reset or a recreated topic needs nothing (docs/streams-idempotence.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from schemas import ClickEvent
from streamrank import keys
from streamrank.redis.pipeline import ScriptCall
from streams.windows import Window, bucket_expire_at_ms, bucket_start

ENTRY = 7  # per entry in the detail argument: user index, member number, 5 counter slots
SLOTS = 5  # counter slots an entry can add to: user fine n, coarse n, category; item fine, coarse

# KEYS: this generation's id set, the previous one's, sequence keys, counter bucket keys.
# ARGV[1]: n = [user entries, item entries, users], h = [cap, sequence TTL ms, id set PEXPIREAT],
# m = ids, s = per user [count, score, member, ...], c = triples [bucket (negative: its first
# field in this call), field, sum], x = PEXPIREAT per bucket. ARGV[2]: e = ENTRY per entry.
APPLY_SETS_LUA = """
local d = cjson.decode(ARGV[1])
local nu, nusers = d.n[1], d.n[3]
local cap, seq_ttl, ids_until = d.h[1], d.h[2], d.h[3]
local m, s, c, x = d.m, d.s, d.c, d.x
local seen
for g = 1, 2 do
  for j = 1, #m, 4000 do
    local r = redis.call('SMISMEMBER', KEYS[g], unpack(m, j, math.min(j + 3999, #m)))
    for k = 1, #r do
      if r[k] == 1 then seen = seen or {}; seen[j + k - 1] = true end
    end
  end
end
local applied = nu
local drop, minus
if seen then
  drop, minus = {}, {}
  local e = cjson.decode(ARGV[2]).e
  local start, pos = {}, 1
  for u = 1, nusers do start[u] = pos; pos = pos + 1 + 2 * s[pos] end
  for k in pairs(seen) do
    local o = ENTRY * (k - 1)
    if e[o + 1] > 0 then
      applied = applied - 1
      drop[start[e[o + 1]] + 2 * e[o + 2] - 1] = true
    end
    for j = o + 3, o + ENTRY do
      local slot = e[j]
      if slot > 0 then minus[slot] = (minus[slot] or 0) + 1 end
    end
  end
end
local pos = 1
for u = 1, nusers do
  local key = KEYS[2 + u]
  local list, first, last = s, pos + 1, pos + 2 * s[pos]
  pos = last + 1
  if drop then
    list = {}
    for j = first, last, 2 do
      if not drop[j] then list[#list + 1] = s[j]; list[#list + 1] = s[j + 1] end
    end
    first, last = 1, #list
  end
  if last >= first then
    for j = first, last, 4000 do
      redis.call('ZADD', key, unpack(list, j, math.min(j + 3999, last)))
    end
    redis.call('ZREMRANGEBYRANK', key, 0, -cap - 1)
    redis.call('PEXPIRE', key, seq_ttl)
  end
end
local base = 2 + nusers
local touched = minus and {}
local slot = 0
for j = 1, #c, 3 do
  slot = slot + 1
  local b, v = c[j], c[j + 2]
  local new = b < 0
  if new then b = -b end
  if minus then v = v - (minus[slot] or 0) end
  if v > 0 then
    local r = redis.call('HINCRBY', KEYS[base + b], c[j + 1], v)
    if touched then touched[b] = true
    elseif new and r == v then redis.call('PEXPIREAT', KEYS[base + b], x[b]) end
  end
end
if touched then
  for b in pairs(touched) do redis.call('PEXPIREAT', KEYS[base + b], x[b]) end
end
for j = 1, #m, 4000 do
  redis.call('SADD', KEYS[1], unpack(m, j, math.min(j + 3999, #m)))
end
redis.call('PEXPIREAT', KEYS[1], ids_until)
return applied
""".replace("ENTRY", str(ENTRY))

SlotOf = Callable[[str], int]  # hash tag -> the group (slot) its keys belong to


@dataclass(slots=True)
class SetsGroup:
    """The entries of one slot group: ids, per-entry detail, summed effects (see the module)."""

    slot: int
    ids: list[str] = field(default_factory=list)
    detail: list[int] = field(default_factory=list)  # flat, ENTRY per entry
    sequences: dict[str, list[str]] = field(default_factory=dict)  # user -> [score, member, ...]
    user_index: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, int] = field(default_factory=dict)  # key -> index (1-based)
    expiry: list[str] = field(default_factory=list)  # PEXPIREAT ms per bucket
    slots: dict[tuple[str, str], int] = field(default_factory=dict)  # (bucket, field) -> slot
    sums: list[str | int] = field(default_factory=list)  # flat triples: bucket, field, sum
    user_entries: int = 0
    item_entries: int = 0

    def member(self, user: str, score: str, member: str) -> tuple[int, int]:
        """Add a sequence member; (user index, its number among the user's members)."""
        index = self.user_index.get(user)
        if index is None:
            index = self.user_index[user] = len(self.user_index) + 1
            self.sequences[user] = [score, member]
            return index, 1
        found = self.sequences[user]
        found += (score, member)
        return index, len(found) // 2

    def add(self, key: str, expire_at_ms: int, name: str) -> int:
        """Count 1 into ``name`` of bucket ``key``; the slot (1-based) of that sum."""
        slot = self.slots.get((key, name))
        if slot is not None:
            self.sums[3 * slot - 1] += 1  # type: ignore[operator]
            return slot
        bucket = self.buckets.get(key)
        new = bucket is None
        if bucket is None:
            bucket = self.buckets[key] = len(self.buckets) + 1
            self.expiry.append(str(expire_at_ms))
        slot = self.slots[(key, name)] = len(self.slots) + 1
        self.sums.extend((-bucket if new else bucket, name, 1))
        return slot

    def call(self, head: list[int | str]) -> ScriptCall:
        generation_keys = [keys.event_ids(self.slot, g) for g in (head[3], head[4])]  # type: ignore[arg-type]
        all_keys = generation_keys + [keys.sequence(u) for u in self.sequences] + list(self.buckets)
        flat: list[str | int] = []
        for members in self.sequences.values():
            flat.append(len(members) // 2)
            flat += members
        payload = orjson.dumps(
            {
                "n": [self.user_entries, self.item_entries, len(self.sequences)],
                "h": head[:3],
                "m": self.ids,
                "s": flat,
                "c": self.sums,
                "x": self.expiry,
            }
        )
        detail = orjson.dumps({"e": self.detail})
        return ScriptCall(keys=all_keys, args=(payload, detail))


@dataclass(frozen=True, slots=True)
class Buckets:
    """An event's fine and coarse counter buckets: start (epoch s), expiry (ms), still alive."""

    fine_start: int
    fine_exp: int
    fine_alive: bool
    coarse_start: int
    coarse_exp: int
    coarse_alive: bool


def event_buckets(ts: int, windows: tuple[Window, Window], lateness_s: int, now_ms: int) -> Buckets:
    """The buckets an event at ``ts`` counts into, and whether each is still alive at now."""
    fine, coarse = windows
    fine_start = bucket_start(ts, fine.resolution_s)
    coarse_start = bucket_start(ts, coarse.resolution_s)
    fine_exp = bucket_expire_at_ms(fine_start, fine, lateness_s)
    coarse_exp = bucket_expire_at_ms(coarse_start, coarse, lateness_s)
    return Buckets(
        fine_start, fine_exp, fine_exp > now_ms, coarse_start, coarse_exp, coarse_exp > now_ms
    )


class SetsAssembly:
    """The slot groups of one batch, filled event by event (see :func:`assemble_sets`)."""

    def __init__(
        self,
        *,
        now_ms: int,
        windows: tuple[Window, Window],
        lateness_s: int,
        slot_of: SlotOf | None,
    ) -> None:
        self.now_ms = now_ms
        self.windows = windows
        self.fine_res, self.coarse_res = windows[0].resolution_s, windows[1].resolution_s
        self.lateness_s = lateness_s
        self.slot_of = slot_of
        self.groups: dict[int, SetsGroup] = {}
        self.tag_groups: dict[str, SetsGroup] = {}
        self._buckets: dict[int, Buckets] = {}
        self.too_old = 0

    def group(self, tag: str) -> SetsGroup:
        found = self.tag_groups.get(tag)
        if found is None:
            slot = self.slot_of(tag) if self.slot_of is not None else 0
            found = self.groups.get(slot)
            if found is None:
                found = self.groups[slot] = SetsGroup(slot)
            self.tag_groups[tag] = found
        return found

    def buckets(self, ts: int) -> Buckets:
        """:func:`event_buckets`, once per fine bucket of the batch (they hold many events)."""
        fine = ts // 1000 // self.fine_res
        found = self._buckets.get(fine)
        if found is None:
            found = self._buckets[fine] = event_buckets(
                ts, self.windows, self.lateness_s, self.now_ms
            )
        return found

    def add(self, event: ClickEvent) -> None:
        """The event's entry in its user's group, and its item side there or in its shard's."""
        b = self.buckets(event.ts)
        user, item = event.user_id, event.item_id
        ug = self.group(keys.user_tag(user))
        ident = f"{user}{keys.FIELD_SEP}{event.event_id}"
        member = keys.sequence_member(event.event_id, item, event.category, event.action)
        u_index, number = ug.member(user, str(event.ts), member)
        slots = [0] * SLOTS
        if b.fine_alive:
            bucket = keys.user_counter_bucket(user, self.fine_res, b.fine_start)
            slots[0] = ug.add(bucket, b.fine_exp, "n")
        if b.coarse_alive:
            bucket = keys.user_counter_bucket(user, self.coarse_res, b.coarse_start)
            slots[1] = ug.add(bucket, b.coarse_exp, "n")
            if event.category:
                slots[2] = ug.add(bucket, b.coarse_exp, keys.category_field(event.category))
        else:
            self.too_old += 1
        ug.ids.append(ident)
        ug.user_entries += 1
        if b.fine_alive or b.coarse_alive:
            shard = keys.item_shard(item)
            ig = self.group(keys.item_tag(shard))
            item_slots = self.add_item_side(ig, shard, item, b)
            if ig is ug:
                slots[3], slots[4] = item_slots
                ug.item_entries += 1
            else:
                ig.ids.append(ident)
                ig.item_entries += 1
                ig.detail.extend((0, 0, 0, 0, 0, *item_slots))
        ug.detail.extend((u_index, number, *slots))

    def add_item_side(self, ig: SetsGroup, shard: int, item: str, b: Buckets) -> tuple[int, int]:
        fine = coarse = 0
        if b.fine_alive:
            fine = ig.add(keys.item_counter_bucket(shard, self.fine_res, b.fine_start), b.fine_exp, item)  # fmt: skip
        if b.coarse_alive:
            coarse = ig.add(
                keys.item_counter_bucket(shard, self.coarse_res, b.coarse_start), b.coarse_exp, item
            )
        return fine, coarse


def assemble_sets(
    events: Sequence[ClickEvent],
    *,
    now_ms: int,
    windows: tuple[Window, Window],
    lateness_s: int,
    sequence_length: int,
    sequence_ttl_s: int,
    dedupe_ttl_s: int,
    slot_of: SlotOf | None = None,
) -> tuple[list[ScriptCall], int]:
    """The ``id_sets`` script calls for ``events`` (validated, unique by (user_id, event_id)),
    one per slot group, and how many events were too old for every counter window.

    The dedupe generation is ``now_ms // dedupe_ttl_s`` (processing time): each call checks its
    group's sets of this generation and the previous one and adds to this one, which expires
    at the end of the next generation, so an id is remembered for at least ``dedupe_ttl_s``.
    Integers that may exceed Lua's 14 significant digits travel as strings.
    """
    ttl_ms = dedupe_ttl_s * 1000
    generation = now_ms // ttl_ms
    head: list[int | str] = [
        sequence_length,
        str(sequence_ttl_s * 1000),
        str((generation + 2) * ttl_ms),
        generation,
        generation - 1,
    ]
    assembly = SetsAssembly(now_ms=now_ms, windows=windows, lateness_s=lateness_s, slot_of=slot_of)
    for event in events:
        assembly.add(event)
    return [g.call(head) for g in assembly.groups.values()], assembly.too_old
