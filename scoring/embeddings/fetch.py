"""Reading the rows of a batch of ids: one round trip, by a Lua script or a pipeline.

The script (default) checks that the table's meta still carries the publish id this process
cached, then ``HGET``s every requested id from its bucket: one call and three reply elements for
the whole batch. The pipeline mode (``HGET`` the publish id, one ``HMGET`` per touched bucket)
is also one round trip but costs redis-py a command object and a reply parse per bucket, and a
150-id batch touches ~150 buckets (see docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import redis.asyncio as aioredis

from scoring.embeddings.bucketing import bucket_of, group_by_bucket
from scoring.embeddings.meta import EncodedRows, FetchMode, TableMeta
from streamrank import keys
from streamrank.errors import EmbeddingError

_SEP = keys.FIELD_SEP

# KEYS[1] = the table's meta key. ARGV: [1] the publish id this process cached, [2] row width,
# [3] bucket key prefix, [4] ids joined by \x1f, [5] their bucket numbers joined by ','.
# Reply: {publish_id} alone when it differs (the table was deleted or republished: re-read the
# meta), else {publish_id, rows concatenated (zeros for missing), one flag byte per id:
# '1' found, '0' missing, '2' wrong size}. Three reply elements for any batch size: redis-py's
# pure-Python reply parser costs ~5 us per element, so per-row replies would dominate.
# The bucket keys are built in the script from the prefix (fine on standalone/Sentinel Redis;
# Redis Cluster would need a hash tag per table, see docs/embeddings.md).
_FETCH_LUA = """
local pid = redis.call('HGET', KEYS[1], 'publish_id')
if pid ~= ARGV[1] then return {pid} end
local w = tonumber(ARGV[2])
local zero = string.rep('\\0', w)
local prefix = ARGV[3]
local ids = {}
for id in string.gmatch(ARGV[4], '[^\\31]+') do ids[#ids + 1] = id end
local rows, flags = {}, {}
local i = 0
for b in string.gmatch(ARGV[5], '[^,]+') do
  i = i + 1
  local v = redis.call('HGET', prefix .. b, ids[i])
  if not v then
    rows[i] = zero; flags[i] = '0'
  elseif #v ~= w then
    rows[i] = zero; flags[i] = '2'
  else
    rows[i] = v; flags[i] = '1'
  end
end
return {pid, table.concat(rows), table.concat(flags)}
"""


class RowFetcher:
    """Fetches encoded rows of distinct ids; ``fetch`` returns ``(publish id, rows)``, rows
    None when the publish id differs from the meta's (the table was deleted or republished)."""

    def __init__(self, *, redis: aioredis.Redis, mode: FetchMode = "script") -> None:
        self.redis: Any = redis
        self.mode = mode
        self._script = redis.register_script(_FETCH_LUA)

    async def fetch(
        self, meta: TableMeta, ids: Sequence[str]
    ) -> tuple[bytes | None, EncodedRows | None]:
        meta_key = keys.embedding_meta(meta.version, meta.table)
        width = meta.row_bytes
        # Ids that cannot be in a table (publish refuses them) are not sent: they would break
        # the script's \x1f-joined argument.
        joined = _SEP.join(ids)
        if all(ids) and joined.count(_SEP) == len(ids) - 1:
            askable, asked = None, ids  # the common case, checked at C speed
        else:
            askable = [bool(i) and _SEP not in i for i in ids]
            asked = [i for i, ok in zip(ids, askable, strict=True) if ok]
            joined = _SEP.join(asked)
        if not asked:
            pid = await self.redis.hget(meta_key, "publish_id")
            return pid, EncodedRows(meta, bytes(width * len(ids)), np.zeros(len(ids), dtype=bool))
        buckets = bucket_of(asked, meta.buckets)
        if self.mode == "script":
            reply = await self._script(
                keys=[meta_key],
                args=[
                    meta.publish_id,
                    width,
                    keys.embedding_bucket_prefix(meta.version, meta.table),
                    joined,
                    ",".join(map(str, buckets.tolist())),
                ],
            )
            if len(reply) == 1:  # publish id differed: rows were not read
                return reply[0], None
            pid, blob, flag_bytes = reply
            flags = np.frombuffer(flag_bytes, dtype=np.uint8)  # [asked]
        else:
            pid, blob, flags = await self._pipeline(meta, asked, buckets)
            if pid is None or pid.decode() != meta.publish_id:
                return pid, None
        if (flags == ord("2")).any():
            bad = [asked[int(k)] for k in np.flatnonzero(flags == ord("2"))[:10]]
            raise EmbeddingError(
                f"rows of {bad} in {meta.version}/{meta.table} are not {width} bytes: the table's "
                f"metadata and rows disagree; delete and republish version {meta.version!r}"
            )
        found = flags == ord("1")  # [asked]
        if askable is not None:
            full_found = np.zeros(len(ids), dtype=bool)
            full = np.zeros((len(ids), width), dtype=np.uint8)
            where = np.flatnonzero(askable)
            full_found[where] = found
            full[where] = np.frombuffer(blob, dtype=np.uint8).reshape(-1, width)
            return pid, EncodedRows(meta, full.tobytes(), full_found)
        return pid, EncodedRows(meta, blob, found)

    async def _pipeline(
        self, meta: TableMeta, ids: Sequence[str], buckets: npt.NDArray[np.int64]
    ) -> tuple[bytes | None, bytes, npt.NDArray[np.uint8]]:
        """The same fetch as a pipeline: HGET the publish id, then one HMGET per touched bucket."""
        width = meta.row_bytes
        _order, unique, groups = group_by_bucket(buckets)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(keys.embedding_meta(meta.version, meta.table), "publish_id")
        for bucket, group in zip(unique.tolist(), groups, strict=True):
            fields = [ids[p] for p in group.tolist()]
            pipe.hmget(keys.embedding_bucket(meta.version, meta.table, bucket), fields)
        replies = await pipe.execute()
        rows: list[bytes] = [b""] * len(ids)
        flags = np.zeros(len(ids), dtype=np.uint8) + ord("0")
        zero = bytes(width)
        for group, values in zip(groups, replies[1:], strict=True):
            for p, v in zip(group.tolist(), values, strict=True):
                if v is None:
                    rows[p] = zero
                elif len(v) != width:
                    rows[p], flags[p] = zero, ord("2")
                else:
                    rows[p], flags[p] = v, ord("1")
        return replies[0], b"".join(rows), flags
