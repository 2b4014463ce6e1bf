"""Reading the rows of a batch of ids: one round trip, by Lua script calls or a pipeline.

A table's buckets are grouped into shards, one hash tag each (:mod:`streamrank.keys`). The
script (default) runs once per slot group: on a single server one call for the whole batch, on
a cluster one call per slot the batch's shards live in, sent as one pipeline per node with the
nodes read concurrently (:func:`streamrank.redis.pipeline.run_scripts`). Each call first checks
that one of its shards' copies of the publish id is still the one this process cached, then
``HGET``s each id from its shard's overlay (when the table has one) and else from its bucket,
and replies with four elements however many ids it read. The pipeline mode (``GET`` the
shards' publish and overlay ids, ``HMGET`` per touched overlay and bucket) is also one
round trip but costs redis-py a command object and a reply parse per bucket, and a 150-id batch
touches ~150 buckets (see docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from scoring.embeddings.bucketing import bucket_of, group_by_bucket
from scoring.embeddings.meta import EncodedRows, FetchMode, TableMeta
from streamrank import keys
from streamrank.errors import EmbeddingError
from streamrank.redis.client import slot_grouping
from streamrank.redis.pipeline import NodePipeline, ScriptCall, run_scripts

_SEP = keys.FIELD_SEP

# KEYS: [1] the publish-id key of one of the call's shards (any one: see _scripts), [2] that
# shard's overlay-id key, then the nb bucket keys it reads, then the overlay keys of their shards.
# ARGV: [1] the publish id this process cached, [2] row width, [3] nb, [4] ids joined by \x1f,
# [5] per id the index of its bucket among the bucket keys, [6] per bucket the index of its
# shard's overlay key among the overlay keys, both joined by ','.
# Reply: {publish id found} alone when it differs (the table was deleted or republished: re-read
# the meta), else {publish id, rows concatenated (zeros for missing), one flag byte per id: '1'
# found, '3' found in the overlay, '0' missing, '2' wrong size; the overlay id seen}. The overlay
# is read only when the shard has an overlay id: at most one more HGET per id, none without one.
# Four reply elements for any batch size: redis-py's pure-Python reply parser pays per element,
# so per-row replies would dominate (docs/embeddings.md#reads-one-round-trip-per-batch).
_FETCH_LUA = """
local pid = ARGV[1]
local found = redis.call('GET', KEYS[1])
if found ~= pid then return {found} end
local ovid = redis.call('GET', KEYS[2])
local w = tonumber(ARGV[2])
local nb = tonumber(ARGV[3])
local zero = string.rep('\\0', w)
local ids = {}
for id in string.gmatch(ARGV[4], '[^\\31]+') do ids[#ids + 1] = id end
local ov = {}
if ovid then
  local j = 0
  for o in string.gmatch(ARGV[6], '[^,]+') do j = j + 1; ov[j] = KEYS[2 + nb + tonumber(o)] end
end
local rows, flags = {}, {}
local i = 0
for b in string.gmatch(ARGV[5], '[^,]+') do
  i = i + 1
  local k = tonumber(b)
  local v, f = false, '1'
  if ovid then
    v = redis.call('HGET', ov[k], ids[i])
    if v then f = '3' end
  end
  if not v then v = redis.call('HGET', KEYS[2 + k], ids[i]) end
  if not v then
    rows[i] = zero; flags[i] = '0'
  elseif #v ~= w then
    rows[i] = zero; flags[i] = '2'
  else
    rows[i] = v; flags[i] = f
  end
end
return {pid, table.concat(rows), table.concat(flags), ovid or ''}
"""

Positions = npt.NDArray[np.intp]


_FOUND, _OVERLAY, _BAD = ord("1"), ord("3"), ord("2")


def _rows(
    meta: TableMeta, blob: bytes, flags: npt.NDArray[np.uint8], overlay_id: str
) -> EncodedRows:
    found = (flags == _FOUND) | (flags == _OVERLAY)
    overlay = flags == _OVERLAY
    return EncodedRows(meta, blob, found, overlay_id, overlay if overlay.any() else None)


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


class RowFetcher:
    """Fetches encoded rows of distinct ids; ``fetch`` returns ``(publish id, rows)``, rows
    None when a publish id differs from the meta's (the table was deleted or republished).

    An id's row is its overlay row when the table has one for it, else its base row. The rows
    carry the overlay id observed; when calls on several nodes saw different ones (an upsert
    was becoming visible), the smallest: overlay ids only grow and each is set after its rows,
    so every row read is at least as new as it, and a cache labelling them with it sees the
    newer id later and drops them (scoring.embeddings.overlay)."""

    def __init__(self, *, redis: Any, mode: FetchMode = "script") -> None:
        self.redis: Any = redis
        self.mode = mode
        self._script = redis.register_script(_FETCH_LUA)
        self._slot_of = slot_grouping(redis)

    async def fetch(
        self, meta: TableMeta, ids: Sequence[str]
    ) -> tuple[bytes | None, EncodedRows | None]:
        width = meta.row_bytes
        # Ids that cannot be in a table (publish refuses them) are not sent: they would break
        # the script's \x1f-joined argument.
        joined = _SEP.join(ids)
        if all(ids) and joined.count(_SEP) == len(ids) - 1:
            askable, asked = None, list(ids)  # the common case, checked at C speed
        else:
            askable = [bool(i) and _SEP not in i for i in ids]
            asked = [i for i, ok in zip(ids, askable, strict=True) if ok]
        if not asked:
            pid = await self.redis.hget(keys.embedding_meta(meta.version, meta.table), "publish_id")
            return pid, EncodedRows(meta, bytes(width * len(ids)), np.zeros(len(ids), dtype=bool))
        buckets = bucket_of(asked, meta.buckets)
        if self.mode == "script":
            pid, blob, flags, ovid = await self._scripts(meta, asked, buckets)
        else:
            pid, blob, flags, ovid = await self._pipeline(meta, asked, buckets)
        if blob is None:  # a publish id differed: rows were not read
            return pid, None
        if (flags == _BAD).any():
            bad = [asked[int(k)] for k in np.flatnonzero(flags == _BAD)[:10]]
            raise EmbeddingError(
                f"rows of {bad} in {meta.version}/{meta.table} are not {width} bytes: the table's "
                f"metadata and rows disagree; delete and republish version {meta.version!r}"
            )
        if askable is not None:
            full_flags = np.zeros(len(ids), dtype=np.uint8)
            full = np.zeros((len(ids), width), dtype=np.uint8)
            where = np.flatnonzero(askable)
            full_flags[where] = flags
            full[where] = np.frombuffer(blob, dtype=np.uint8).reshape(-1, width)
            return pid, _rows(meta, full.tobytes(), full_flags, ovid)
        return pid, _rows(meta, blob, flags, ovid)

    def _groups(self, meta: TableMeta, buckets: npt.NDArray[np.int64]) -> list[Positions]:
        """Positions of the ids read by each script call: all of them on a single server, else
        one group per slot of the shards they are in."""
        if self._slot_of is None:
            return [np.arange(len(buckets))]
        shards = keys.embedding_shard(buckets, meta.shards)  # [n]
        tags = {
            int(s): self._slot_of(keys.embedding_shard_tag(meta.version, meta.table, int(s)))
            for s in np.unique(shards).tolist()
        }
        slots = np.array([tags[s] for s in shards.tolist()], dtype=np.int64)  # [n]
        _order, _unique, groups = group_by_bucket(slots)  # positions ascending within a group
        return groups

    def _call(
        self, meta: TableMeta, ids: list[str], positions: Positions, buckets: npt.NDArray[np.int64]
    ) -> ScriptCall:
        """The script call reading ``ids[positions]`` (all in one slot)."""
        distinct, index = np.unique(buckets[positions], return_inverse=True)
        shards = keys.embedding_shard(distinct, meta.shards)  # [b]
        overlay_shards, overlay_index = np.unique(shards, return_inverse=True)
        # One shard's copy of the publish id is enough to check: a delete removes every
        # shard's copy before it removes any row (EmbeddingStore.delete_version_keys), so
        # while one copy is there, every row the call reads is of that publish. Checking
        # each touched shard cost ~15 more script keys per single-server fetch. Likewise one
        # copy of the overlay id: an upsert sets every shard's copy after all of its rows.
        shard = int(shards[0])
        v, t = meta.version, meta.table
        call_keys = [keys.embedding_publish_id(v, t, shard), keys.embedding_overlay_id(v, t, shard)]
        call_keys += [meta.bucket_key(b) for b in distinct.tolist()]
        call_keys += [keys.embedding_overlay(v, t, s) for s in overlay_shards.tolist()]
        args = (
            meta.publish_id,
            meta.row_bytes,
            len(distinct),
            _SEP.join(ids[p] for p in positions.tolist()),
            ",".join(map(str, (index + 1).tolist())),
            ",".join(map(str, (overlay_index + 1).tolist())),
        )
        return ScriptCall(keys=call_keys, args=args)

    async def _scripts(
        self, meta: TableMeta, ids: list[str], buckets: npt.NDArray[np.int64]
    ) -> tuple[bytes | None, bytes | None, npt.NDArray[np.uint8], str]:
        """One script call per slot group; returns (publish id, rows in id order, flags,
        overlay id observed)."""
        width = meta.row_bytes
        groups = self._groups(meta, buckets)
        calls = [self._call(meta, ids, positions, buckets) for positions in groups]
        replies = await run_scripts(self.redis, self._script, calls)
        for reply in replies:
            if len(reply) == 1:
                return reply[0], None, np.zeros(0, dtype=np.uint8), ""
        ovid = min(_text(reply[3]) for reply in replies)
        if len(groups) == 1:
            pid, blob, flag_bytes, _ = replies[0]
            return pid, blob, np.frombuffer(flag_bytes, dtype=np.uint8), ovid
        rows = np.zeros((len(ids), width), dtype=np.uint8)
        flags = np.zeros(len(ids), dtype=np.uint8)
        for positions, (_pid, blob, flag_bytes, _) in zip(groups, replies, strict=True):
            rows[positions] = np.frombuffer(blob, dtype=np.uint8).reshape(-1, width)
            flags[positions] = np.frombuffer(flag_bytes, dtype=np.uint8)
        return replies[0][0], rows.tobytes(), flags, ovid

    async def _pipeline(
        self, meta: TableMeta, ids: Sequence[str], buckets: npt.NDArray[np.int64]
    ) -> tuple[bytes | None, bytes | None, npt.NDArray[np.uint8], str]:
        """The same fetch as a pipeline: GET the touched shards' publish ids and overlay ids,
        one HMGET per touched shard's overlay, then one HMGET per touched bucket (each node
        runs its commands in that order, so the rows are at least as new as the ids)."""
        width = meta.row_bytes
        v, t = meta.version, meta.table
        _order, unique, groups = group_by_bucket(buckets)
        id_shards = keys.embedding_shard(buckets, meta.shards)  # [n]
        shards = np.unique(id_shards).tolist()
        pipe = NodePipeline(self.redis)
        for shard in shards:
            key = keys.embedding_publish_id(v, t, shard)
            pipe.add(key, "GET", key)
            key = keys.embedding_overlay_id(v, t, shard)
            pipe.add(key, "GET", key)
        in_shard = [np.flatnonzero(id_shards == shard) for shard in shards]
        for shard, positions in zip(shards, in_shard, strict=True):
            key = keys.embedding_overlay(v, t, shard)
            pipe.add(key, "HMGET", key, *[ids[p] for p in positions.tolist()])
        for bucket, group in zip(unique.tolist(), groups, strict=True):
            key = meta.bucket_key(bucket)
            pipe.add(key, "HMGET", key, *[ids[p] for p in group.tolist()])
        replies = await pipe.execute()
        head, n = replies[: 2 * len(shards)], len(shards)
        for pid in head[0::2]:
            if pid is None or pid.decode() != meta.publish_id:
                return pid, None, np.zeros(0, dtype=np.uint8), ""
        ovid = min(_text(o) for o in head[1::2])
        overlay: list[bytes | None] = [None] * len(ids)
        for positions, values in zip(in_shard, replies[2 * n : 3 * n], strict=True):
            for p, value in zip(positions.tolist(), values, strict=True):
                overlay[p] = value
        rows: list[bytes] = [b""] * len(ids)
        flags = np.zeros(len(ids), dtype=np.uint8) + ord("0")
        zero = bytes(width)
        for group, values in zip(groups, replies[3 * n :], strict=True):
            for p, base in zip(group.tolist(), values, strict=True):
                v_ = overlay[p] if overlay[p] is not None else base
                if v_ is None:
                    rows[p] = zero
                elif len(v_) != width:
                    rows[p], flags[p] = zero, _BAD
                else:
                    rows[p], flags[p] = v_, _OVERLAY if overlay[p] is not None else _FOUND
        return head[0], b"".join(rows), flags, ovid
