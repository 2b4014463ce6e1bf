"""Applying one batch of clicks to Redis in one round trip: a Lua script run with EVALSHA.

Why a script rather than a pipeline: the counters are increments, which are not idempotent, so
each event's increments must be applied if and only if its ``sr:seen:{event_id}`` marker was
set by this very call. The script does, per event, ``SET seen 1 NX PX dedupe_ttl`` and only for
first-seen events adds the sequence member and the counter increments; Redis runs the script
atomically, so a crash or timeout leaves either all of an event's effects with its marker or
none of them, and a replay (at-least-once redelivery) applies nothing twice. Increments are
summed inside the script per (key, field) so a batch issues one HINCRBY per distinct field, one
ZADD + ZREMRANGEBYRANK + PEXPIRE per distinct user and one PEXPIREAT per distinct bucket.

redis-py's ``Script`` object runs EVALSHA and, on NOSCRIPT (a restarted or flushed Redis),
loads the script again and retries. Works on Redis 6.2 (no functions, no HEXPIRE).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis

from schemas import ClickEvent
from streamrank import keys
from streamrank.redis_errors import redis_call
from streams.windows import Window, bucket_expire_at_ms, bucket_start

logger = logging.getLogger(__name__)

APPLY_BATCH_LUA = """
local d = cjson.decode(ARGV[1])
local n, nu = d.n[1], d.n[2]
local cap, seq_ttl, seen_ttl = d.h[1], d.h[2], d.h[3]
local expiry = d.x
local events = d.e
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
for i = 1, n do
  if redis.call('SET', KEYS[i], '1', 'NX', 'PX', seen_ttl) then
    local e = events[i]
    applied = applied + 1
    local s = seqs[e[1]]
    if not s then s = {}; seqs[e[1]] = s end
    s[#s + 1] = e[2]
    s[#s + 1] = e[3]
    add(e[4], 'n')
    add(e[5], 'n')
    if e[9] ~= '' then add(e[5], e[9]) end
    add(e[6], e[8])
    add(e[7], e[8])
  end
end
for u, s in pairs(seqs) do
  local key = KEYS[n + u]
  for j = 1, #s, 4000 do
    redis.call('ZADD', key, unpack(s, j, math.min(j + 3999, #s)))
  end
  redis.call('ZREMRANGEBYRANK', key, 0, -cap - 1)
  redis.call('PEXPIRE', key, seq_ttl)
end
for b, h in pairs(incr) do
  local key = KEYS[n + nu + b]
  for f, v in pairs(h) do
    redis.call('HINCRBY', key, f, v)
  end
  redis.call('PEXPIREAT', key, expiry[b])
end
return applied
"""


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """Keys and the one argument of one run of the batch script, plus what it skipped."""

    keys: list[str]
    payload: bytes
    too_old_for_counters: int


def assemble(
    events: Sequence[ClickEvent],
    *,
    now_ms: int,
    windows: tuple[Window, Window],
    lateness_s: int,
    sequence_length: int,
    sequence_ttl_s: int,
    dedupe_ttl_s: int,
) -> ScriptCall:
    """Arguments of the batch script for ``events`` (already validated and unique by event_id).

    KEYS = seen keys (one per event), then sequence keys (one per distinct user), then counter
    bucket keys (one per distinct bucket). ARGV[1] = one JSON document (one argument instead of
    nine per event: redis-py packs each argument in Python, which cost more than the rest of
    the batch): ``n`` = [events, users, buckets], ``h`` = [cap, sequence TTL ms, dedupe TTL ms],
    ``x`` = PEXPIREAT time (ms) per bucket key, ``e`` = per event [user index, score, member,
    user fine, user coarse, item fine, item coarse bucket index (0 = not counted: the bucket
    has already expired), item id, category field or ""]. Integers that may exceed Lua's
    14 significant digits travel as strings.
    """
    fine, coarse = windows
    seen_keys: list[str] = []
    user_index: dict[str, int] = {}
    bucket_index: dict[str, int] = {}
    bucket_expiry: list[str] = []
    per_event: list[list[str | int]] = []
    too_old = 0

    def bucket(key: str, expire_at_ms: int) -> int:
        index = bucket_index.get(key)
        if index is None:
            index = bucket_index[key] = len(bucket_index) + 1
            bucket_expiry.append(str(expire_at_ms))
        return index

    for event in events:
        seen_keys.append(keys.seen(event.event_id))
        uidx = user_index.get(event.user_id)
        if uidx is None:
            uidx = user_index[event.user_id] = len(user_index) + 1
        fine_start = bucket_start(event.ts, fine.resolution_s)
        coarse_start = bucket_start(event.ts, coarse.resolution_s)
        fine_exp = bucket_expire_at_ms(fine_start, fine, lateness_s)
        coarse_exp = bucket_expire_at_ms(coarse_start, coarse, lateness_s)
        ufine = ifine = ucoarse = icoarse = 0
        if fine_exp > now_ms:
            ufine = bucket(
                keys.user_counter_bucket(event.user_id, fine.resolution_s, fine_start), fine_exp
            )
            ifine = bucket(keys.item_counter_bucket(fine.resolution_s, fine_start), fine_exp)
        if coarse_exp > now_ms:
            ucoarse = bucket(
                keys.user_counter_bucket(event.user_id, coarse.resolution_s, coarse_start),
                coarse_exp,
            )
            icoarse = bucket(
                keys.item_counter_bucket(coarse.resolution_s, coarse_start), coarse_exp
            )
        else:
            too_old += 1
        per_event.append(
            [
                uidx,
                str(event.ts),
                keys.sequence_member(event.event_id, event.item_id, event.category),
                ufine,
                ucoarse,
                ifine,
                icoarse,
                event.item_id,
                keys.category_field(event.category) if event.category else "",
            ]
        )
    all_keys = seen_keys + [keys.sequence(u) for u in user_index] + list(bucket_index)
    payload = orjson.dumps(
        {
            "n": [len(seen_keys), len(user_index), len(bucket_index)],
            "h": [sequence_length, str(sequence_ttl_s * 1000), str(dedupe_ttl_s * 1000)],
            "x": bucket_expiry,
            "e": per_event,
        }
    )
    return ScriptCall(all_keys, payload, too_old)


class BatchWriter:
    """Runs the batch script; ``await writer.apply(call)`` returns how many events were new."""

    def __init__(self, *, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._script: Any = redis.register_script(APPLY_BATCH_LUA)

    async def apply(self, call: ScriptCall) -> int:
        """Apply one batch; raises RedisUnavailable when Redis does not answer (safe to retry)."""
        if not call.keys:
            return 0
        with redis_call(
            "the feature batch",
            "the batch will be retried; check that Redis is up and STREAMRANK_REDIS_URL is right",
        ):
            return int(await self._script(keys=call.keys, args=[call.payload]))
