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
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamrank.errors import RedisUnavailable
from streams.batch import ScriptCall

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


class BatchWriter:
    """Runs the batch script; ``await writer.apply(call)`` returns how many events were new."""

    def __init__(self, *, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._script: Any = redis.register_script(APPLY_BATCH_LUA)

    async def apply(self, call: ScriptCall) -> int:
        """Apply one batch; raises RedisUnavailable when Redis does not answer (safe to retry)."""
        if not call.keys:
            return 0
        try:
            return int(await self._script(keys=call.keys, args=[call.payload]))
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise RedisUnavailable(
                f"Redis did not apply the feature batch ({exc}); the batch will be retried, "
                "check that Redis is up and STREAMRANK_REDIS_URL is right"
            ) from exc
