"""The overlay of a published embedding table: rows upserted after its publish.

A published table is immutable; new or changed items get rows in an overlay instead, one hash
per shard (``keys.embedding_overlay``) in the same hash tag as the base buckets of its ids, so
the fetch script reads overlay-then-base in one call (scoring.embeddings.fetch). An upsert:
checks the table is published, validates and encodes the rows with the table's codec, writes
them, then takes the next overlay id (a zero-padded sequence in the meta) and raises every
shard's copy of it, then the meta's (each only ever raised). Since an id is taken after its
rows are written and ids only grow, a reader that sees overlay id X sees every row of every
upsert up to X, so caches label rows with the overlay id they were read under and drop them
when it changes (scoring.embeddings.cache). Deleting the version deletes its overlay; a
republish (delete, then publish) starts with none, as publish removes every key of the table
it finds first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from scoring.embeddings.bucketing import bucket_of
from scoring.embeddings.codec import FloatMatrix, encode_rows
from scoring.embeddings.meta import TableMeta
from scoring.embeddings.validate import check_ids, check_matrix, check_name
from streamrank import keys
from streamrank.errors import ContractError, EmbeddingError
from streamrank.redis.errors import redis_call
from streamrank.redis.pipeline import NodePipeline, ScriptCall, run_scripts

_FP16_MAX = 65504.0
_SHOW = 10

# KEYS[1] the meta. ARGV[1] the publish id the rows were encoded for. Returns the next overlay
# id (12 digits, zero-padded, so ids compare as strings in sequence order), or false when the
# table is gone or was republished (the rows are of another publish).
_NEXT_ID_LUA = """
if redis.call('HGET', KEYS[1], 'publish_id') ~= ARGV[1] then return false end
return string.format('%012d', redis.call('HINCRBY', KEYS[1], 'overlay_seq', 1))
"""
# KEYS[1] an overlay-id copy. ARGV[1] the new id. Raises it, never lowers it.
_RAISE_COPY_LUA = """
local cur = redis.call('GET', KEYS[1])
if (not cur) or cur < ARGV[1] then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""
# KEYS[1] the meta. ARGV: publish id, new overlay id, rows new to the overlay. Raises the meta's
# overlay id and counts the rows, if the table is still that publish.
_FINISH_LUA = """
if redis.call('HGET', KEYS[1], 'publish_id') ~= ARGV[1] then return 0 end
local cur = redis.call('HGET', KEYS[1], 'overlay_id')
if (not cur) or cur < ARGV[2] then redis.call('HSET', KEYS[1], 'overlay_id', ARGV[2]) end
redis.call('HINCRBY', KEYS[1], 'overlay_rows', tonumber(ARGV[3]))
return 1
"""


@dataclass(frozen=True, slots=True)
class UpsertReport:
    version: str
    table: str
    rows: int  # rows written
    new_rows: int  # of them, ids the overlay did not hold before
    overlay_id: str
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "table": self.table,
            "rows": self.rows,
            "new_rows": self.new_rows,
            "overlay_id": self.overlay_id,
            "seconds": round(self.seconds, 4),
        }


def decode_row(
    raw: bytes | str, *, dim: int, encoding: str, max_id_length: int = 128
) -> tuple[str, FloatMatrix]:
    """One JSON row ``{"id": str, "vector": [dim finite numbers]}`` -> ``(id, float32[dim])``;
    a ContractError with a reason code (``not_json``, ``missing_field``, ``bad_type``,
    ``bad_value``, ``bad_dim``, ``not_finite``, ``out_of_range``) otherwise."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ContractError(f"not valid UTF-8 JSON: {exc}", reason="not_json") from None
    if not isinstance(obj, dict):
        raise ContractError("expected a JSON object with 'id' and 'vector'", reason="not_object")
    for name in ("id", "vector"):
        if name not in obj:
            raise ContractError(f"field '{name}' is missing", field=name, reason="missing_field")
    item, vector = obj["id"], obj["vector"]
    if not isinstance(item, str):
        raise ContractError("field 'id' must be a string", field="id", reason="bad_type")
    if not item or len(item) > max_id_length or any(c < " " or c == "\x7f" for c in item):
        raise ContractError(
            f"field 'id' must be 1-{max_id_length} characters without control characters",
            field="id",
            reason="bad_value",
        )
    if not isinstance(vector, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in vector
    ):
        raise ContractError("field 'vector' must be an array of numbers", reason="bad_type")
    if len(vector) != dim:
        raise ContractError(
            f"vector of {item!r} has {len(vector)} values, the table's dim is {dim}",
            field="vector",
            reason="bad_dim",
        )
    if not all(math.isfinite(x) for x in vector):
        raise ContractError(
            f"vector of {item!r} has NaN or Inf", field="vector", reason="not_finite"
        )
    with np.errstate(over="ignore"):
        row = np.asarray(vector, dtype=np.float64).astype(np.float32)
    if not np.isfinite(row).all() or (encoding == "fp16" and np.abs(row).max() > _FP16_MAX):
        raise ContractError(
            f"vector of {item!r} is out of the {encoding} table's range",
            field="vector",
            reason="out_of_range",
        )
    return item, row


def read_jsonl(path: str, *, dim: int, encoding: str) -> tuple[list[str], FloatMatrix]:
    """Every row of a JSON-lines file (blank lines skipped; a repeated id: the last wins), or
    an EmbeddingError naming the bad lines: nothing is written unless every row is good."""
    rows: dict[str, FloatMatrix] = {}
    errors: list[str] = []
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item, row = decode_row(line, dim=dim, encoding=encoding)
            except ContractError as exc:
                errors.append(f"line {number}: {exc.reason}: {exc}")
                continue
            rows[item] = row
    if errors:
        more = f" (and {len(errors) - _SHOW} more)" if len(errors) > _SHOW else ""
        raise EmbeddingError(
            f"{path}: {len(errors)} bad rows, nothing written: " + "; ".join(errors[:_SHOW]) + more
        )
    if not rows:
        raise EmbeddingError(f"{path} holds no rows")
    return list(rows), np.stack(list(rows.values()))


class OverlayWriter:
    """Writes upserts into the overlay of published tables; ``table_meta`` reads a table's
    meta from Redis (UnknownVersion when it is not published)."""

    def __init__(
        self, *, redis: Any, table_meta: Callable[[str, str], Awaitable[TableMeta]]
    ) -> None:
        self.redis: Any = redis
        self._table_meta = table_meta
        self._next_id = redis.register_script(_NEXT_ID_LUA)
        self._raise_copy = redis.register_script(_RAISE_COPY_LUA)
        self._finish = redis.register_script(_FINISH_LUA)

    async def upsert(
        self, table: str, ids: Sequence[str], matrix: npt.NDArray[Any], *, version: str
    ) -> UpsertReport:
        """Validate (the table's dim, finite values, unique ids), encode with the table's codec,
        write the rows, then publish a new overlay id. Nothing is written when a row is bad."""
        started = time.perf_counter()
        check_name("version", version)
        check_name("table", table)
        meta = await self._table_meta(version, table)
        id_list = check_ids(ids)
        m32 = check_matrix(id_list, matrix, meta.encoding, meta.dim)
        encoded = encode_rows(m32, meta.encoding)  # [n, row_bytes]
        with redis_call(f"an upsert into the overlay of {version}/{table}", "run it again"):
            new_rows = await self._write_rows(meta, id_list, encoded)
            overlay_id = await self._publish_id(meta, new_rows)
        return UpsertReport(
            version=version,
            table=table,
            rows=len(id_list),
            new_rows=new_rows,
            overlay_id=overlay_id,
            seconds=time.perf_counter() - started,
        )

    async def _write_rows(
        self, meta: TableMeta, ids: list[str], encoded: npt.NDArray[np.uint8]
    ) -> int:
        """One HSET per touched shard's overlay; returns how many ids were new to it."""
        shards = keys.embedding_shard(bucket_of(ids, meta.buckets), meta.shards)  # [n]
        flat, width = encoded.tobytes(), encoded.shape[1]
        pipe = NodePipeline(self.redis)
        for shard in np.unique(shards).tolist():
            fields: list[Any] = []
            for p in np.flatnonzero(shards == shard).tolist():
                fields += (ids[p], flat[p * width : (p + 1) * width])
            key = keys.embedding_overlay(meta.version, meta.table, shard)
            pipe.add(key, "HSET", key, *fields)
        return int(sum(await pipe.execute()))

    async def _publish_id(self, meta: TableMeta, new_rows: int) -> str:
        """Take the next overlay id, raise every shard's copy to it, then the meta's."""
        meta_key = keys.embedding_meta(meta.version, meta.table)
        overlay_id = await self._next_id(keys=[meta_key], args=[meta.publish_id])
        if not overlay_id:
            raise EmbeddingError(
                f"{meta.version}/{meta.table} was deleted or republished during the upsert; "
                "its rows may be left in the overlay of no table (the next publish removes "
                "them): upsert again into the version now published"
            )
        text = overlay_id.decode() if isinstance(overlay_id, bytes) else str(overlay_id)
        calls = [
            ScriptCall(keys=[keys.embedding_overlay_id(meta.version, meta.table, s)], args=(text,))
            for s in range(meta.shards)
        ]
        await run_scripts(self.redis, self._raise_copy, calls)
        await self._finish(keys=[meta_key], args=[meta.publish_id, text, new_rows])
        return text
