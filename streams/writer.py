"""Applying one batch of clicks to Redis in one round trip: Lua script calls, one per hash slot.

Two write contracts share this shell (setting ``write_contract``): ``id_sets``, the default
(:mod:`streams.id_sets`: an event-id set per slot group, sums made in the worker), and
``markers``, the previous one, described here and kept for comparison (``streamrank bench
streams --ab-script``). :func:`assemble` builds either; :class:`BatchWriter` runs either.

Why a script rather than a pipeline: the counters are increments, which are not idempotent, so
an event's increments must be applied if and only if its dedupe marker was set by this very
call. The script does, per event, ``SET marker 1 NX`` and only for first-seen events adds the
sequence member and the counter increments; Redis runs a script atomically, so a crash or
timeout leaves either all of its effects with their markers or none of them, and a replay
(at-least-once redelivery) applies nothing twice. Increments are summed inside the script per
(key, field), so a call issues one HINCRBY per distinct field, one ZADD + ZREMRANGEBYRANK +
PEXPIRE per distinct user and one PEXPIREAT per distinct bucket.

An event touches two slots (:mod:`streamrank.keys`): its user's (marker, sequence, user
counters) and its item shard's (item counters). Each side has its own marker, so each side is
applied once on its own: :func:`assemble` splits a batch into one call per slot group (on a
cluster, per hash slot; on a single server everything is one group, one call), and
:class:`BatchWriter` sends the calls as one pipeline per node, the nodes concurrently
(:func:`streamrank.redis.pipeline.run_scripts`). A batch counts as written only when every call
answered; after a partial failure the whole batch is sent again, and the calls that had been
applied find their markers and change nothing. Works on Redis 6.2 (no functions, no HEXPIRE).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from schemas import ClickEvent
from streamrank import keys
from streamrank.redis.errors import redis_call
from streamrank.redis.pipeline import ReplicaWait, ScriptCall, run_scripts
from streams.id_sets import APPLY_SETS_LUA, assemble_sets
from streams.windows import Window, bucket_expire_at_ms, bucket_start

logger = logging.getLogger(__name__)

USER_ENTRY = 6  # values per user entry in the script's flat "u" list
ITEM_ENTRY = 4  # values per item entry in its flat "i" list

# KEYS: user-side markers, item-side markers, sequence keys, counter bucket keys (see assemble).
# d.u and d.i are flat: USER_ENTRY values per user entry, ITEM_ENTRY per item entry.
APPLY_BATCH_LUA = """
local d = cjson.decode(ARGV[1])
local nu, ni, ns = d.n[1], d.n[2], d.n[3]
local cap, seq_ttl, seen_ttl = d.h[1], d.h[2], d.h[3]
local expiry = d.x
local seqs = {}
local incr = {}
local applied = 0
local function add(b, f)
  if b > 0 then
    local h = incr[b]
    if not h then h = {}; incr[b] = h end
    h[f] = (h[f] or 0) + 1
  end
end
local u, it = d.u, d.i
for k = 1, nu do
  if redis.call('SET', KEYS[k], '1', 'NX', 'PX', seen_ttl) then
    local o = USER_ENTRY * (k - 1)
    applied = applied + 1
    local s = seqs[u[o + 1]]
    if not s then s = {}; seqs[u[o + 1]] = s end
    s[#s + 1] = u[o + 2]
    s[#s + 1] = u[o + 3]
    add(u[o + 4], 'n')
    add(u[o + 5], 'n')
    if u[o + 6] ~= '' then add(u[o + 5], u[o + 6]) end
  end
end
for k = 1, ni do
  local o = ITEM_ENTRY * (k - 1)
  if redis.call('SET', KEYS[nu + k], '1', 'NX', 'PXAT', it[o + 1]) then
    add(it[o + 2], it[o + 4])
    add(it[o + 3], it[o + 4])
  end
end
local base = nu + ni
for u, s in pairs(seqs) do
  local key = KEYS[base + u]
  for j = 1, #s, 4000 do
    redis.call('ZADD', key, unpack(s, j, math.min(j + 3999, #s)))
  end
  redis.call('ZREMRANGEBYRANK', key, 0, -cap - 1)
  redis.call('PEXPIRE', key, seq_ttl)
end
base = base + ns
for b, h in pairs(incr) do
  local key = KEYS[base + b]
  for f, v in pairs(h) do
    redis.call('HINCRBY', key, f, v)
  end
  redis.call('PEXPIREAT', key, expiry[b])
end
return applied
""".replace("USER_ENTRY", str(USER_ENTRY)).replace("ITEM_ENTRY", str(ITEM_ENTRY))

SlotOf = Callable[[str], int]  # hash tag -> the group (slot) its keys belong to
WriteContract = Literal["id_sets", "markers"]


@dataclass(slots=True)
class _Group:
    """The keys and per-event entries of one script call (one slot group)."""

    user_markers: list[str] = field(default_factory=list)
    item_markers: list[str] = field(default_factory=list)
    users: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, int] = field(default_factory=dict)
    expiry: list[str] = field(default_factory=list)
    user_entries: list[str | int] = field(default_factory=list)  # flat, USER_ENTRY per entry
    item_entries: list[str | int] = field(default_factory=list)  # flat, ITEM_ENTRY per entry

    def user(self, user_id: str) -> int:
        index = self.users.get(user_id)
        if index is None:
            index = self.users[user_id] = len(self.users) + 1
        return index

    def bucket(self, key: str, expire_at_ms: int) -> int:
        index = self.buckets.get(key)
        if index is None:
            index = self.buckets[key] = len(self.buckets) + 1
            self.expiry.append(str(expire_at_ms))
        return index

    def call(self, head: list[Any]) -> ScriptCall:
        all_keys = (
            self.user_markers
            + self.item_markers
            + [keys.sequence(u) for u in self.users]
            + list(self.buckets)
        )
        payload = orjson.dumps(
            {
                "n": [len(self.user_markers), len(self.item_markers), len(self.users)],
                "h": head,
                "x": self.expiry,
                "u": self.user_entries,
                "i": self.item_entries,
            }
        )
        return ScriptCall(keys=all_keys, args=(payload,))


@dataclass(frozen=True, slots=True)
class BatchCalls:
    """The script calls of one batch (one per slot group), what the batch skipped, and the
    contract (script) the calls are for."""

    calls: list[ScriptCall]
    events: int
    too_old_for_counters: int
    contract: WriteContract = "id_sets"


def assemble(
    events: Sequence[ClickEvent],
    *,
    now_ms: int,
    windows: tuple[Window, Window],
    lateness_s: int,
    sequence_length: int,
    sequence_ttl_s: int,
    dedupe_ttl_s: int,
    slot_of: SlotOf | None = None,
    contract: WriteContract = "id_sets",
) -> BatchCalls:
    """The script calls for ``events`` (already validated and unique by (user_id, event_id))
    under ``contract``; what follows describes ``markers`` (``id_sets``:
    :func:`streams.id_sets.assemble_sets`).

    ``slot_of`` maps a hash tag to its group (on a cluster, ``redis.crc.key_slot``); None puts
    everything in one call (a single server). Each event adds a user-side entry to its user's
    group and, when one of its item buckets is still alive, an item-side entry to its item
    shard's group.

    Per call, KEYS = user-side markers, item-side markers, sequence keys (one per distinct
    user), counter bucket keys (one per distinct bucket). ARGV[1] = one JSON document (one
    argument instead of several per event: redis-py packs each argument in Python, which cost
    more than the rest of the batch): ``n`` = [user entries, item entries, users], ``h`` =
    [cap, sequence TTL ms, dedupe TTL ms], ``x`` = PEXPIREAT time (ms) per bucket key, ``u`` =
    per user entry user index, score, member, user fine, user coarse bucket index (0 = not
    counted: the bucket has already expired), category field or "", ``i`` = per item entry
    marker PXAT ms, item fine, item coarse bucket index, item id. Both lists are flat
    (``USER_ENTRY`` / ``ITEM_ENTRY`` values per entry): a list per entry cost Redis' JSON decoder
    one Lua table per event (docs/streams-idempotence.md). Integers that may exceed
    Lua's 14 significant digits travel as strings. The item marker lives until the event's
    last live item bucket expires (a replay after that counts nothing anyway) or the dedupe
    window ends, whichever is first.
    """
    if contract == "id_sets":
        calls, too_old = assemble_sets(
            events,
            now_ms=now_ms,
            windows=windows,
            lateness_s=lateness_s,
            sequence_length=sequence_length,
            sequence_ttl_s=sequence_ttl_s,
            dedupe_ttl_s=dedupe_ttl_s,
            slot_of=slot_of,
        )
        return BatchCalls(calls, len(events), too_old, "id_sets")
    head = [sequence_length, str(sequence_ttl_s * 1000), str(dedupe_ttl_s * 1000)]
    assembly = _Assembly(
        now_ms=now_ms,
        windows=windows,
        lateness_s=lateness_s,
        dedupe_until=now_ms + dedupe_ttl_s * 1000,
        slot_of=slot_of,
    )
    for event in events:
        assembly.add(event)
    return BatchCalls(
        [g.call(head) for g in assembly.groups.values()], len(events), assembly.too_old, "markers"
    )


@dataclass(frozen=True, slots=True)
class _Buckets:
    """An event's fine and coarse counter buckets: start (epoch s), expiry (ms), still alive."""

    fine_start: int
    fine_exp: int
    fine_alive: bool
    coarse_start: int
    coarse_exp: int
    coarse_alive: bool


class _Assembly:
    """The slot groups of one batch, filled event by event (see :func:`assemble`)."""

    def __init__(
        self,
        *,
        now_ms: int,
        windows: tuple[Window, Window],
        lateness_s: int,
        dedupe_until: int,
        slot_of: SlotOf | None,
    ) -> None:
        self.now_ms = now_ms
        self.fine, self.coarse = windows
        self.lateness_s = lateness_s
        self.dedupe_until = dedupe_until
        self.slot_of = slot_of
        self.groups: dict[int, _Group] = {}
        self.user_groups: dict[str, _Group] = {}
        self.shard_groups: dict[int, _Group] = {}
        self.too_old = 0

    def group(self, tag: str) -> _Group:
        slot = self.slot_of(tag) if self.slot_of is not None else 0
        found = self.groups.get(slot)
        if found is None:
            found = self.groups[slot] = _Group()
        return found

    def buckets(self, ts: int) -> _Buckets:
        fine, coarse = self.fine, self.coarse
        fine_start = bucket_start(ts, fine.resolution_s)
        coarse_start = bucket_start(ts, coarse.resolution_s)
        fine_exp = bucket_expire_at_ms(fine_start, fine, self.lateness_s)
        coarse_exp = bucket_expire_at_ms(coarse_start, coarse, self.lateness_s)
        return _Buckets(
            fine_start, fine_exp, fine_exp > self.now_ms,
            coarse_start, coarse_exp, coarse_exp > self.now_ms,
        )  # fmt: skip

    def add(self, event: ClickEvent) -> None:
        """The event's user-side entry and, while one of its item buckets lives, its item side."""
        b = self.buckets(event.ts)
        self.add_user_side(event, b)
        if b.fine_alive or b.coarse_alive:
            self.add_item_side(event, b)

    def add_user_side(self, event: ClickEvent, b: _Buckets) -> None:
        user = event.user_id
        ug = self.user_groups.get(user)
        if ug is None:
            ug = self.user_groups[user] = self.group(keys.user_tag(user))
        ufine = ucoarse = 0
        if b.fine_alive:
            ufine = ug.bucket(
                keys.user_counter_bucket(user, self.fine.resolution_s, b.fine_start), b.fine_exp
            )
        if b.coarse_alive:
            ucoarse = ug.bucket(
                keys.user_counter_bucket(user, self.coarse.resolution_s, b.coarse_start),
                b.coarse_exp,
            )
        else:
            self.too_old += 1
        ug.user_markers.append(keys.seen(user, event.event_id))
        ug.user_entries.extend(
            (
                ug.user(user),
                str(event.ts),
                keys.sequence_member(event.event_id, event.item_id, event.category, event.action),
                ufine,
                ucoarse,
                keys.category_field(event.category) if event.category else "",
            )
        )

    def add_item_side(self, event: ClickEvent, b: _Buckets) -> None:
        shard = keys.item_shard(event.item_id)
        ig = self.shard_groups.get(shard)
        if ig is None:
            ig = self.shard_groups[shard] = self.group(keys.item_tag(shard))
        ifine = icoarse = 0
        if b.fine_alive:
            ifine = ig.bucket(
                keys.item_counter_bucket(shard, self.fine.resolution_s, b.fine_start), b.fine_exp
            )
        if b.coarse_alive:
            icoarse = ig.bucket(
                keys.item_counter_bucket(shard, self.coarse.resolution_s, b.coarse_start),
                b.coarse_exp,
            )
        until = min(
            self.dedupe_until,
            max(b.fine_exp if b.fine_alive else 0, b.coarse_exp if b.coarse_alive else 0),
        )
        ig.item_markers.append(keys.item_seen(shard, event.event_id))
        ig.item_entries.extend((str(until), ifine, icoarse, event.item_id))


class BatchWriter:
    """Runs a batch's script calls (the script of the batch's contract); ``await
    writer.apply(batch)`` returns how many events were new. ``wait_replicas``: see
    :class:`streamrank.redis.pipeline.ReplicaWait`."""

    def __init__(self, *, redis: Any, wait_replicas: int = 0, wait_timeout_ms: int = 1000) -> None:
        self._redis = redis
        self._scripts: dict[str, Any] = {
            "markers": redis.register_script(APPLY_BATCH_LUA),
            "id_sets": redis.register_script(APPLY_SETS_LUA),
        }
        self._wait = ReplicaWait(wait_replicas, wait_timeout_ms) if wait_replicas else None

    async def apply(self, batch: BatchCalls) -> int:
        """Apply one batch; raises RedisUnavailable when Redis does not answer (safe to retry)."""
        if not batch.calls:
            return 0
        with redis_call(
            "the feature batch",
            "the batch will be retried; check that Redis is up and STREAMRANK_REDIS_URL is right",
        ):
            script = self._scripts[batch.contract]
            replies = await run_scripts(self._redis, script, batch.calls, wait=self._wait)
        return sum(int(r) for r in replies)
