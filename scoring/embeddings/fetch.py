"""Reading the rows of a batch of ids: one round trip, by Lua script calls or a pipeline.

A table's buckets are grouped into shards, one hash tag each (:mod:`streamrank.keys`). The
script (default) runs once per slot group: on a single server one call for the whole batch, on
a cluster one call per slot the batch's shards live in, sent as one pipeline per node with the
nodes read concurrently (:func:`streamrank.redis.pipeline.run_scripts`). Each call first checks
that one of its shards' copies of the publish id is still the one this process cached, then
``HGET``s its ids from their buckets, and replies with three elements however many ids it read.
The pipeline mode (``GET`` the shards' publish ids, one ``HMGET`` per touched bucket) is also one
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

# KEYS: the publish-id key of one of the call's shards (any one: see _scripts), then the bucket keys it reads. ARGV: [1] the
# publish id this process cached, [2] row width, [3] how many publish-id keys, [4] ids joined
# by \x1f, [5] per id the index of its bucket among the bucket keys, joined by ','.
# Reply: {publish id found} alone when a shard's differs (the table was deleted or republished:
# re-read the meta), else {publish id, rows concatenated (zeros for missing), one flag byte per
# id: '1' found, '0' missing, '2' wrong size}. Three reply elements for any batch size:
# redis-py's pure-Python reply parser pays per element, so per-row replies would dominate
# (docs/embeddings.md#reads-one-round-trip-per-batch).
_FETCH_LUA = """
local pid = ARGV[1]
local np = tonumber(ARGV[3])
for k = 1, np do
  local found = redis.call('GET', KEYS[k])
  if found ~= pid then return {found} end
end
local w = tonumber(ARGV[2])
local zero = string.rep('\\0', w)
local ids = {}
for id in string.gmatch(ARGV[4], '[^\\31]+') do ids[#ids + 1] = id end
local rows, flags = {}, {}
local i = 0
for b in string.gmatch(ARGV[5], '[^,]+') do
  i = i + 1
  local v = redis.call('HGET', KEYS[np + tonumber(b)], ids[i])
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

Positions = npt.NDArray[np.intp]


class RowFetcher:
    """Fetches encoded rows of distinct ids; ``fetch`` returns ``(publish id, rows)``, rows
    None when a publish id differs from the meta's (the table was deleted or republished)."""

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
            pid, blob, flags = await self._scripts(meta, asked, buckets)
        else:
            pid, blob, flags = await self._pipeline(meta, asked, buckets)
        if blob is None:  # a publish id differed: rows were not read
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

    async def _scripts(
        self, meta: TableMeta, ids: list[str], buckets: npt.NDArray[np.int64]
    ) -> tuple[bytes | None, bytes | None, npt.NDArray[np.uint8]]:
        """One script call per slot group; returns (publish id, rows in id order, flags)."""
        width = meta.row_bytes
        groups = self._groups(meta, buckets)
        calls = []
        for positions in groups:
            group_buckets = buckets[positions]  # [g]
            distinct, index = np.unique(group_buckets, return_inverse=True)
            # One shard's copy of the publish id is enough to check: a delete removes every
            # shard's copy before it removes any row (EmbeddingStore.delete_version_keys), so
            # while one copy is there, every row the call reads is of that publish. Checking
            # each touched shard cost ~15 more script keys per single-server fetch.
            shard = int(keys.embedding_shard(distinct[:1], meta.shards)[0])
            call_keys = [keys.embedding_publish_id(meta.version, meta.table, shard)]
            call_keys += [meta.bucket_key(b) for b in distinct.tolist()]
            calls.append(
                ScriptCall(
                    keys=call_keys,
                    args=(
                        meta.publish_id,
                        width,
                        1,
                        _SEP.join(ids[p] for p in positions.tolist()),
                        ",".join(map(str, (index + 1).tolist())),
                    ),
                )
            )
        replies = await run_scripts(self.redis, self._script, calls)
        for reply in replies:
            if len(reply) == 1:
                return reply[0], None, np.zeros(0, dtype=np.uint8)
        if len(groups) == 1:
            pid, blob, flag_bytes = replies[0]
            return pid, blob, np.frombuffer(flag_bytes, dtype=np.uint8)
        rows = np.zeros((len(ids), width), dtype=np.uint8)
        flags = np.zeros(len(ids), dtype=np.uint8)
        for positions, (_pid, blob, flag_bytes) in zip(groups, replies, strict=True):
            rows[positions] = np.frombuffer(blob, dtype=np.uint8).reshape(-1, width)
            flags[positions] = np.frombuffer(flag_bytes, dtype=np.uint8)
        return replies[0][0], rows.tobytes(), flags

    async def _pipeline(
        self, meta: TableMeta, ids: Sequence[str], buckets: npt.NDArray[np.int64]
    ) -> tuple[bytes | None, bytes | None, npt.NDArray[np.uint8]]:
        """The same fetch as a pipeline: GET the touched shards' publish ids, then one HMGET
        per touched bucket."""
        width = meta.row_bytes
        _order, unique, groups = group_by_bucket(buckets)
        shards = np.unique(keys.embedding_shard(unique, meta.shards)).tolist()
        pipe = NodePipeline(self.redis)
        for shard in shards:
            key = keys.embedding_publish_id(meta.version, meta.table, shard)
            pipe.add(key, "GET", key)
        for bucket, group in zip(unique.tolist(), groups, strict=True):
            key = meta.bucket_key(bucket)
            pipe.add(key, "HMGET", key, *[ids[p] for p in group.tolist()])
        replies = await pipe.execute()
        for pid in replies[: len(shards)]:
            if pid is None or pid.decode() != meta.publish_id:
                return pid, None, np.zeros(0, dtype=np.uint8)
        rows: list[bytes] = [b""] * len(ids)
        flags = np.zeros(len(ids), dtype=np.uint8) + ord("0")
        zero = bytes(width)
        for group, values in zip(groups, replies[len(shards) :], strict=True):
            for p, v in zip(group.tolist(), values, strict=True):
                if v is None:
                    rows[p] = zero
                elif len(v) != width:
                    rows[p], flags[p] = zero, ord("2")
                else:
                    rows[p], flags[p] = v, ord("1")
        return replies[0], b"".join(rows), flags
