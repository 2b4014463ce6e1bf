"""The outcome join: served-log records and later clicks, in Redis, one script call per batch.

Why Redis, and why a script: the served log is keyed by request_id and the clicks by user_id,
so the two streams are not co-partitioned and any worker may see either side of a pair; state
in Redis is shared by every worker and survives restarts and rebalances. Redis runs a script
atomically, so a served record and a click of the same user can never race (each side looks
for the other), and every effect of a record happens together with its dedupe marker.

Per user: ``open`` (pending records, JSON per request), ``items`` (item -> the open requests
that ranked it: a click finds its request in O(1), last touch wins), ``clicks`` (clicks no open
record claimed yet: a served record processed after its click still gets it). Per request: a
``seen`` marker. A served record is joined once (``SET seen NX``); it adds its request,
impressions and scores to its version's statistics bucket (by served_at). A click on an item
of an open record within the window (``served_at <= ts <= served_at + window``) is attributed
once per (request, item): it turns that impression from negative to positive and updates
CTR@k, MRR and the request's AUC in the same bucket. Metrics are therefore provisional until
the window closes (an item not clicked yet counts as not clicked), equally so for every
version served in the same period, which is what the rollout compares.

Closing (:func:`claim_due` / :func:`finish`): records whose close time passed are claimed
(moved forward by a visibility timeout, so concurrent closers never share one and a crashed
closer's claims come back), their final outcomes produced, then removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis

from schemas import ClickEvent
from scoring.rollout.records import Served
from scoring.rollout.stats import latency_bin, ranks_by_score, score_bin
from streamrank import keys
from streamrank.errors import ConfigError
from streamrank.redis.errors import redis_call
from streamrank.settings import RedisSettings, Settings

# Open requests remembered per (user, item) in the last-touch index.
INDEX_CAP = 8

JOIN_LUA = r"""
local d = cjson.decode(ARGV[1])
local window, user_ttl, seen_ttl, stats_ttl, horizon = d.cfg[1], d.cfg[2], d.cfg[3], d.cfg[4], d.cfg[5]
local nu, ns = d.nu, #d.s
local due_key, versions_key = KEYS[3 * nu + ns + 1], KEYS[3 * nu + ns + 2]
local SEP = '\31'
local ints, floats, touched = {}, {}, {}
local out = {0, 0, 0, 0, 0, 0}  -- joined, duplicate served, degraded, clicks, repeated clicks, buffered

local function add_int(k, f, v)
  local h = ints[k]; if not h then h = {}; ints[k] = h end
  h[f] = (h[f] or 0) + v
end
local function add_float(k, f, v)
  local h = floats[k]; if not h then h = {}; floats[k] = h end
  h[f] = (h[f] or 0) + v
end
local function split(s)
  local parts, start = {}, 1
  while true do
    local i = string.find(s, SEP, start, true)
    if not i then parts[#parts + 1] = string.sub(s, start); return parts end
    parts[#parts + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end
local function request_auc(rec)
  local n, np = #rec.s, 0
  for _ in pairs(rec.c) do np = np + 1 end
  if np == 0 or np == n then return nil end
  local wins = 0
  for key, _ in pairs(rec.c) do
    local sp = rec.s[tonumber(key)]
    for j = 1, n do
      if not rec.c[tostring(j)] then
        local sj = rec.s[j]
        if sp > sj then wins = wins + 1 elseif sp == sj then wins = wins + 0.5 end
      end
    end
  end
  return wins / (np * (n - np))
end
local function gauc_term(k, w, a, sign)
  add_int(k, 'gn', sign)
  add_float(k, 'gw', sign * w); add_float(k, 'gwa', sign * w * a)
  add_float(k, 'gw2', sign * w * w); add_float(k, 'gw2a', sign * w * w * a)
  add_float(k, 'gw2a2', sign * w * w * a * a)
end
-- attribute a click on position p of a pending record (false when that item was clicked before)
local function click(rec, p, event_id)
  local key = tostring(p)
  if rec.c[key] then return false end
  rec.c[key] = event_id
  local k = rec.k
  add_int(k, 'clk', 1)
  add_int(k, 'n:' .. rec.b[p], -1); add_int(k, 'p:' .. rec.b[p], 1)
  local r, old = rec.r[p], rec.best
  if old == 0 then add_int(k, 'creq', 1) end
  if old == 0 or r < old then
    for _, top in ipairs({1, 5, 10}) do
      if r <= top and (old == 0 or old > top) then add_int(k, 'h' .. top, 1) end
    end
    local new_rr, old_rr = 1 / r, 0
    if old > 0 then old_rr = 1 / old end
    add_float(k, 'rr', new_rr - old_rr); add_float(k, 'rr2', new_rr * new_rr - old_rr * old_rr)
    rec.best = r
  end
  local w = #rec.s
  if rec.a then gauc_term(k, w, rec.a, -1) end
  local a = request_auc(rec)
  if a then gauc_term(k, w, a, 1); rec.a = a else rec.a = false end
  return true
end

for i = 1, ns do
  local s = d.s[i]
  local u = s[1]
  local open_key, items_key, clicks_key = KEYS[3 * u - 2], KEYS[3 * u - 1], KEYS[3 * u]
  local req, version, served_at, k = s[2], s[3], s[4], s[5]
  if redis.call('SET', KEYS[3 * nu + i], '1', 'NX', 'PX', seen_ttl) then
    if s[7] >= 0 then add_int(k, 'l:' .. s[7], 1) end
    redis.call('ZADD', versions_key, 'GT', served_at, version)  -- GT still adds new members
    if s[6] == 1 then
      add_int(k, 'deg', 1)
      out[3] = out[3] + 1
    else
      out[1] = out[1] + 1
      local items, scores, bins, ranks = s[8], s[9], s[10], s[11]
      add_int(k, 'req', 1); add_int(k, 'imp', #items)
      for j = 1, #bins do add_int(k, 'n:' .. bins[j], 1) end
      local rec = {v = version, t = served_at, k = k, i = items, s = scores, b = bins, r = ranks,
                   c = {}, best = 0, a = false}
      local first = {}
      for j = 1, #items do if not first[items[j]] then first[items[j]] = j end end
      local waiting = redis.call('ZRANGEBYSCORE', clicks_key, served_at, served_at + window)
      for _, m in ipairs(waiting) do
        local parts = split(m)
        local p = first[parts[2]]
        if p then
          if click(rec, p, parts[1]) then out[4] = out[4] + 1 end
          redis.call('ZREM', clicks_key, m)
        end
      end
      redis.call('HSET', open_key, req, cjson.encode(rec))
      local distinct = {}
      for item, _ in pairs(first) do distinct[#distinct + 1] = item end
      local current = redis.call('HMGET', items_key, unpack(distinct))
      local updates = {}
      for j = 1, #distinct do
        local value = req
        if current[j] then
          local ids = split(current[j])
          ids[#ids + 1] = req
          local from = math.max(1, #ids - d.cap + 1)
          value = table.concat(ids, SEP, from, #ids)
        end
        updates[#updates + 1] = distinct[j]; updates[#updates + 1] = value
      end
      redis.call('HSET', items_key, unpack(updates))
      redis.call('ZADD', due_key, s[12], s[13])
      touched[u] = true
    end
  else
    out[2] = out[2] + 1
  end
end

for _, c in ipairs(d.c) do
  local u = c[1]
  local open_key, items_key, clicks_key = KEYS[3 * u - 2], KEYS[3 * u - 1], KEYS[3 * u]
  local event_id, item, ts = c[2], c[3], c[4]
  local claimed = false
  local index = redis.call('HGET', items_key, item)
  if index then
    local ids = split(index)
    for j = #ids, 1, -1 do
      local raw = redis.call('HGET', open_key, ids[j])
      if raw then
        local rec = cjson.decode(raw)
        if rec.t <= ts and ts <= rec.t + window then
          local p = 0
          for q = 1, #rec.i do if rec.i[q] == item then p = q; break end end
          if p > 0 then
            claimed = true
            if click(rec, p, event_id) then
              redis.call('HSET', open_key, ids[j], cjson.encode(rec))
              out[4] = out[4] + 1
            else
              out[5] = out[5] + 1
            end
            break
          end
        end
      end
    end
  end
  if not claimed then
    redis.call('ZADD', clicks_key, ts, event_id .. SEP .. item)
    out[6] = out[6] + 1
    touched[u] = true
  end
end

for u, _ in pairs(touched) do
  redis.call('ZREMRANGEBYSCORE', KEYS[3 * u], '-inf', '(' .. horizon)
  for j = 2, 0, -1 do redis.call('PEXPIRE', KEYS[3 * u - j], user_ttl) end
end
for k, h in pairs(ints) do
  for f, v in pairs(h) do if v ~= 0 then redis.call('HINCRBY', k, f, v) end end
  redis.call('PEXPIRE', k, stats_ttl)
end
for k, h in pairs(floats) do
  for f, v in pairs(h) do if v ~= 0 then redis.call('HINCRBYFLOAT', k, f, v) end end
  redis.call('PEXPIRE', k, stats_ttl)
end
return out
"""

CLAIM_LUA = """
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, m in ipairs(members) do redis.call('ZADD', KEYS[1], 'XX', ARGV[3], m) end
return members
"""

FINISH_LUA = r"""
local d = cjson.decode(ARGV[1])
local SEP = '\31'
local due_key = KEYS[#KEYS]
for _, e in ipairs(d) do
  local open_key, items_key = KEYS[2 * e[1] - 1], KEYS[2 * e[1]]
  local req = e[2]
  local raw = redis.call('HGET', open_key, req)
  if raw then
    local rec = cjson.decode(raw)
    local seen = {}
    for _, item in ipairs(rec.i) do
      if not seen[item] then
        seen[item] = true
        local index = redis.call('HGET', items_key, item)
        if index then
          local kept = {}
          local start = 1
          while true do
            local i = string.find(index, SEP, start, true)
            local id = string.sub(index, start, (i or 0) - 1)
            if id ~= req then kept[#kept + 1] = id end
            if not i then break end
            start = i + 1
          end
          if #kept == 0 then redis.call('HDEL', items_key, item)
          else redis.call('HSET', items_key, item, table.concat(kept, SEP)) end
        end
      end
    end
    redis.call('HDEL', open_key, req)
  end
  redis.call('ZREM', due_key, e[3])
end
return #d
"""


@dataclass(frozen=True, slots=True)
class JoinCall:
    """Keys and the one argument of one run of the join script."""

    keys: list[str]
    payload: bytes

    @property
    def empty(self) -> bool:
        return not self.keys


@dataclass(frozen=True, slots=True)
class JoinCounts:
    """What one batch did."""

    joined: int = 0
    duplicate_served: int = 0
    degraded: int = 0
    clicks: int = 0
    repeated_clicks: int = 0
    buffered_clicks: int = 0


@dataclass(frozen=True, slots=True)
class JoinConfig:
    window_ms: int
    close_delay_ms: int
    bucket_s: int
    seen_ttl_ms: int
    stats_ttl_ms: int

    @classmethod
    def from_settings(cls, settings: Settings) -> JoinConfig:
        return cls(
            window_ms=settings.outcomes.window_s * 1000,
            close_delay_ms=settings.outcomes.close_delay_s * 1000,
            bucket_s=settings.outcomes.bucket_s,
            seen_ttl_ms=settings.features.dedupe_ttl_s * 1000,
            stats_ttl_ms=settings.outcomes.retention_s * 1000,
        )

    @property
    def user_ttl_ms(self) -> int:
        """Per-user keys outlive the longest open record by a margin (the closer removes them
        earlier; the TTL only cleans up after a closer that never ran)."""
        return self.window_ms + self.close_delay_ms + 600_000

    def bucket_start(self, served_at_ms: int) -> int:
        return served_at_ms // 1000 // self.bucket_s * self.bucket_s

    def stats_key(self, version: str, served_at_ms: int) -> str:
        return keys.outcome_stats(self.bucket_s, version, self.bucket_start(served_at_ms))


def assemble(
    served: Sequence[Served], clicks: Sequence[ClickEvent], *, config: JoinConfig, now_ms: int
) -> JoinCall:
    """Arguments of the join script for one batch (pure).

    KEYS = per distinct user (open, items, clicks), then one seen key per served record, then
    the due and versions keys. ARGV[1] = JSON: ``cfg`` = [window, user TTL, seen TTL, stats
    TTL (ms), horizon: clicks older than this are dropped], ``nu`` users, ``cap`` index cap,
    ``s`` = per served record [user index, request_id, version, served_at, stats key, degraded,
    latency bin (-1: none), items, scores, score bins, ranks, close at, due member], ``c`` = per
    click [user index, event_id, item_id, ts]. Clicks too old to match any open record are
    left out (the histories of a replay, for instance).
    """
    horizon = now_ms - config.window_ms - config.close_delay_ms
    users: dict[str, int] = {}

    def user(uid: str) -> int:
        index = users.get(uid)
        if index is None:
            index = users[uid] = len(users) + 1
        return index

    s_rows: list[list[Any]] = []
    seen_keys: list[str] = []
    for rec in served:
        u = user(rec.user_id)
        seen_keys.append(keys.outcome_seen(rec.user_id, rec.request_id))
        s_rows.append(
            [
                u,
                rec.request_id,
                rec.version,
                rec.served_at,
                config.stats_key(rec.version, rec.served_at),
                1 if rec.degraded else 0,
                -1 if rec.latency_ms is None else latency_bin(rec.latency_ms),
                list(rec.items),
                list(rec.scores),
                [score_bin(x) for x in rec.scores],
                ranks_by_score(rec.scores),
                rec.served_at + config.window_ms + config.close_delay_ms,
                keys.outcome_due_member(rec.user_id, rec.request_id),
            ]
        )
    c_rows = [[user(c.user_id), c.event_id, c.item_id, c.ts] for c in clicks if c.ts >= horizon]
    if not s_rows and not c_rows:
        return JoinCall([], b"")
    user_keys = [
        k
        for uid in users
        for k in (keys.outcome_open(uid), keys.outcome_items(uid), keys.outcome_clicks(uid))
    ]
    payload = orjson.dumps(
        {
            "cfg": [
                config.window_ms,
                config.user_ttl_ms,
                config.seen_ttl_ms,
                config.stats_ttl_ms,
                horizon,
            ],
            "nu": len(users),
            "cap": INDEX_CAP,
            "s": s_rows,
            "c": c_rows,
        }
    )
    return JoinCall(user_keys + seen_keys + [keys.outcome_due(), keys.outcome_versions()], payload)


def require_single_redis(redis: RedisSettings) -> None:
    """The join script touches one user's keys together with the global due/stats/versions
    keys (see :mod:`streamrank.keys`), which a Redis Cluster refuses (CROSSSLOT): say so
    before anything starts."""
    if redis.is_cluster:
        raise ConfigError(
            "online outcomes and staged rollouts need a standalone or Sentinel Redis: their join "
            "script is not cluster-safe yet (docs/rollout.md); run the outcomes worker and "
            "`streamrank rollout` without STREAMRANK_REDIS_CLUSTER / a +cluster URL"
        )


class OutcomeStore:
    """The join's Redis side: apply a batch, claim due records, read them, finish them."""

    def __init__(self, *, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._join: Any = redis.register_script(JOIN_LUA)
        self._claim: Any = redis.register_script(CLAIM_LUA)
        self._finish: Any = redis.register_script(FINISH_LUA)

    async def apply(self, call: JoinCall) -> JoinCounts:
        """Apply one batch; raises RedisUnavailable when Redis does not answer (safe to retry:
        every effect is guarded by a marker or is set-like)."""
        if call.empty:
            return JoinCounts()
        with redis_call("the outcome join", "the batch will be retried; check that Redis is up"):
            out = await self._join(keys=call.keys, args=[call.payload])
        return JoinCounts(*(int(x) for x in out))

    async def claim_due(
        self, *, now_ms: int, limit: int, visibility_ms: int
    ) -> list[tuple[str, str, dict[str, Any] | None]]:
        """Claim up to ``limit`` records whose close time passed: ``(user, request, pending
        record or None when it expired)``. A claim lasts ``visibility_ms``."""
        with redis_call("claiming due outcomes", "the closer retries at its next tick"):
            members = await self._claim(
                keys=[keys.outcome_due()], args=[now_ms, limit, now_ms + visibility_ms]
            )
            if not members:
                return []
            pairs = []
            for raw in members:
                text = raw.decode() if isinstance(raw, bytes) else str(raw)
                user_id, _, request_id = text.partition(keys.FIELD_SEP)
                pairs.append((user_id, request_id))
            pipe = self._redis.pipeline(transaction=False)
            for user_id, request_id in pairs:
                pipe.hget(keys.outcome_open(user_id), request_id)
            values = await pipe.execute()
        return [
            (u, r, None if v is None else orjson.loads(v))
            for (u, r), v in zip(pairs, values, strict=True)
        ]

    async def finish(self, closed: Sequence[tuple[str, str]]) -> int:
        """Remove closed records (their index entries and due entries); idempotent."""
        if not closed:
            return 0
        users: dict[str, int] = {}
        rows = []
        for user_id, request_id in closed:
            index = users.setdefault(user_id, len(users) + 1)
            rows.append([index, request_id, keys.outcome_due_member(user_id, request_id)])
        call_keys = [
            k for uid in users for k in (keys.outcome_open(uid), keys.outcome_items(uid))
        ] + [keys.outcome_due()]
        with redis_call("finishing closed outcomes", "they are claimed again and finished later"):
            return int(await self._finish(keys=call_keys, args=[orjson.dumps(rows)]))
