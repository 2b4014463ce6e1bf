"""The embedding store: compressed rows in Redis hash buckets, versioned, one round trip per batch.

Layout (see streamrank.keys and docs/embeddings.md): rows of ``(version, table)`` are spread
over ``buckets`` hashes ``sr:emb:{version}:{table}:{bucket}`` (field = raw id, value = the
encoded row, scoring.codec), few enough rows each to stay in Redis' compact ziplist/listpack
encoding; ``sr:emb:{version}:{table}:meta`` is written last and marks the table published.

Reads go through one Lua script call per batch (``EVALSHA``): it checks the table's meta still
carries the publish id this process cached, then ``HGET``s every requested id from its bucket.
That is one round trip and one reply for the whole batch; a pipeline of ``HMGET`` per touched
bucket (``fetch_mode="pipeline"``, also one round trip) costs redis-py a command object and a
reply parse per bucket, and a 150-id batch touches ~150 buckets (see docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tqdm import tqdm

from scoring.bucketing import bucket_of, choose_bucket_count, group_by_bucket, stable_hash
from scoring.codec import FloatMatrix, decode_blobs, decode_rows, encode_rows, row_bytes
from scoring.embedding_validate import check_ids, check_matrix, check_name, check_oov_row
from streamrank import keys
from streamrank.errors import ConfigError, EmbeddingError, RedisUnavailable, UnknownVersion

logger = logging.getLogger(__name__)

FetchMode = Literal["script", "pipeline"]

# Redis 6.2 defaults; CONFIG GET may be refused on managed Redis, then these are assumed.
DEFAULT_MAX_ENTRIES = 128
DEFAULT_MAX_VALUE = 64
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


@dataclass(frozen=True, slots=True)
class TableMeta:
    """What a reader needs to know about one published table."""

    version: str
    table: str
    dim: int
    encoding: str
    rows: int
    buckets: int
    oov_blob: bytes
    published_at: float
    publish_id: str

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.encoding, self.dim)

    @property
    def oov_row(self) -> FloatMatrix:
        """The OOV row, decoded, ``float32[dim]``."""
        return decode_blobs([self.oov_blob], self.encoding, self.dim)[0]

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "table": self.table,
            "dim": self.dim,
            "encoding": self.encoding,
            "rows": self.rows,
            "buckets": self.buckets,
            "row_bytes": self.row_bytes,
            "published_at": self.published_at,
            "publish_id": self.publish_id,
        }


@dataclass(frozen=True, slots=True)
class PublishReport:
    version: str
    table: str
    rows: int
    dim: int
    encoding: str
    buckets: int
    max_bucket_rows: int
    compact: bool
    seconds: float


@dataclass(frozen=True, slots=True)
class EncodedRows:
    """One fetch's result: ``blob`` holds ``len(found)`` encoded rows back to back (zeros where
    an id is unknown); ``found[i]`` says whether id ``i`` is in the table."""

    meta: TableMeta
    blob: bytes
    found: npt.NDArray[np.bool_]

    def decode(self) -> FloatMatrix:
        """``float32[n, dim]``, the table's OOV row where an id is unknown (one vectorised pass)."""
        meta = self.meta
        width = meta.row_bytes
        encoded = np.frombuffer(self.blob, dtype=np.uint8).reshape(-1, width)  # [n, row_bytes]
        out = decode_rows(encoded, meta.encoding, meta.dim)  # [n, dim]
        if not self.found.all():
            out[~self.found] = meta.oov_row
        return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _split_versions(split: str) -> set[str]:
    """The versions named in a canary split ``"din-a:0.9,din-b:0.1"`` (weights ignored)."""
    return {chunk.strip().rpartition(":")[0] or chunk.strip() for chunk in split.split(",")}


def _parse_meta(version: str, table: str, raw: dict[bytes, bytes]) -> TableMeta:
    try:
        return TableMeta(
            version=version,
            table=table,
            dim=int(raw[b"dim"]),
            encoding=raw[b"encoding"].decode(),
            rows=int(raw[b"rows"]),
            buckets=int(raw[b"buckets"]),
            oov_blob=bytes(raw[b"oov"]),
            published_at=float(raw[b"published_at"]),
            publish_id=raw[b"publish_id"].decode(),
        )
    except (KeyError, ValueError) as exc:
        raise EmbeddingError(
            f"metadata of table {table!r} in version {version!r} is corrupt ({exc!r}); "
            f"delete the version (`streamrank embeddings delete {version}`) and publish it again"
        ) from exc


class EmbeddingStore:
    """Publish and read versioned embedding tables in Redis.

    ``redis`` must return bytes (``decode_responses=False``). Use :meth:`from_url` to let the
    store own its client (then ``async with`` / :meth:`close` closes it).
    """

    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        fetch_mode: FetchMode = "script",
        configure_redis: bool = True,
        publish_batch_rows: int = 20_000,
        bucket_fill: float = 0.6,
        max_bucket_rows: int = 64,
        owns_client: bool = False,
    ) -> None:
        if redis.connection_pool.connection_kwargs.get("decode_responses"):
            raise ConfigError("EmbeddingStore needs a Redis client with decode_responses=False")
        if fetch_mode not in ("script", "pipeline"):
            raise ConfigError(f"fetch_mode must be 'script' or 'pipeline', got {fetch_mode!r}")
        if not 0 < bucket_fill <= 1:
            raise ConfigError(f"bucket_fill must be in (0, 1], got {bucket_fill}")
        # Any: redis-py's stubs type replies as str, ours are bytes (decode_responses=False).
        self.redis: Any = redis
        self.fetch_mode = fetch_mode
        self.configure_redis = configure_redis
        self.publish_batch_rows = publish_batch_rows
        self.bucket_fill = bucket_fill
        # HGET scans a compact hash linearly, so fuller buckets make every lookup slower while
        # saving little memory: measured at 200k int8 rows, a cap of 128 / 64 / 32 rows per
        # bucket gave 44.7 / 46.4 / 52.7 B/row and 420 / 359 / 315 us of server time per
        # 150-id fetch (docs/embeddings.md). 64 (about 38 rows per bucket) is the middle.
        self.max_bucket_rows = max_bucket_rows
        self._owns_client = owns_client
        self._script = redis.register_script(_FETCH_LUA)
        self._metas: dict[tuple[str, str], TableMeta] = {}
        self.oov_total = 0  # unknown ids served the OOV row (per requested occurrence)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> EmbeddingStore:
        """A store owning its own client (closed by :meth:`close`)."""
        client_kwargs = kwargs.pop("client_kwargs", {})
        client = aioredis.Redis.from_url(url, decode_responses=False, **client_kwargs)
        return cls(redis=client, owns_client=True, **kwargs)

    @classmethod
    def from_settings(cls, settings: Any) -> EmbeddingStore:
        """A store owning a client on ``settings.redis_dsn`` with the settings' timeouts/TLS."""
        return cls.from_url(
            settings.redis_dsn,
            client_kwargs=settings.redis_client_kwargs(),
            fetch_mode=settings.embedding_fetch_mode,
            configure_redis=settings.embedding_configure_redis,
        )

    async def close(self) -> None:
        if self._owns_client:
            await self.redis.aclose()

    async def __aenter__(self) -> EmbeddingStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- publish ---------------------------------------------------------------------------

    async def publish(
        self,
        table: str,
        ids: Sequence[str],
        matrix: npt.NDArray[Any],
        *,
        encoding: str,
        version: str,
        oov_row: npt.ArrayLike | None = None,
        dim: int | None = None,
        progress: bool = True,
    ) -> PublishReport:
        """Validate, then write every row, then the meta (last), then add the version to the set.

        A published ``(version, table)`` is immutable: publishing it again is refused (publish
        a new version instead), so readers may cache its metadata and rows.
        """
        started = time.perf_counter()
        check_name("version", version)
        check_name("table", table)
        id_list = check_ids(ids)
        m32 = check_matrix(id_list, matrix, encoding, dim)
        n, width = m32.shape
        oov = check_oov_row(oov_row, width, encoding)
        try:
            if await self.redis.exists(keys.embedding_meta(version, table)):
                raise EmbeddingError(
                    f"table {table!r} of version {version!r} is already published and versions are "
                    f"immutable; publish under a new version, or `streamrank embeddings delete "
                    f"{version}` first"
                )
            max_entries = min(
                self.max_bucket_rows, await self._ensure_compact(encoding, width, id_list)
            )
            # Rows left by an earlier publish that died before its meta: never mix them in.
            leftovers = await self._delete_matching(keys.embedding_table_pattern(version, table))
            if leftovers:
                logger.warning(
                    "removed %s keys left by an unfinished publish of %s/%s",
                    leftovers,
                    version,
                    table,
                )
            hashes = stable_hash(id_list)
            n_buckets = choose_bucket_count(
                hashes, max_entries=max_entries, target_fill=self.bucket_fill
            )
            buckets = (hashes % np.uint64(n_buckets)).astype(np.int64)  # [n]
            encoded = encode_rows(m32, encoding)  # [n, row_bytes]
            max_rows = await self._write_rows(
                version, table, id_list, encoded, buckets, progress=progress
            )
            publish_id = uuid.uuid4().hex
            meta = {
                "dim": width,
                "encoding": encoding,
                "rows": n,
                "buckets": n_buckets,
                "oov": encode_rows(oov, encoding)[0].tobytes(),
                "published_at": f"{time.time():.3f}",
                "publish_id": publish_id,
            }
            compact = await self._is_compact(version, table, buckets)
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(keys.embedding_meta(version, table), mapping=meta)
            pipe.sadd(keys.embedding_versions(), version)
            await pipe.execute()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise RedisUnavailable(
                f"Redis failed during publish of {version}/{table}: {exc}"
            ) from exc
        if not compact:
            logger.warning(
                "%s/%s: buckets are not in Redis' compact encoding (memory several times larger); "
                "check hash-max-ziplist-value/-entries",
                version,
                table,
            )
        return PublishReport(
            version=version,
            table=table,
            rows=n,
            dim=width,
            encoding=encoding,
            buckets=n_buckets,
            max_bucket_rows=max_rows,
            compact=compact,
            seconds=time.perf_counter() - started,
        )

    async def _ensure_compact(self, encoding: str, dim: int, ids: list[str]) -> int:
        """Make sure rows and ids fit the compact hash encoding; returns the max entries per hash."""
        need_value = max(row_bytes(encoding, dim), max(len(i.encode("utf-8")) for i in ids))
        try:
            conf = {
                _text(k): v for k, v in (await self.redis.config_get("hash-max-ziplist-*")).items()
            }
            max_entries = int(conf.get("hash-max-ziplist-entries", DEFAULT_MAX_ENTRIES))
            max_value = int(conf.get("hash-max-ziplist-value", DEFAULT_MAX_VALUE))
        except ResponseError as exc:
            logger.warning(
                "CONFIG GET refused (%s); assuming hash-max-ziplist-entries %s / -value %s",
                exc,
                DEFAULT_MAX_ENTRIES,
                DEFAULT_MAX_VALUE,
            )
            max_entries, max_value = DEFAULT_MAX_ENTRIES, DEFAULT_MAX_VALUE
            if need_value > max_value:
                raise EmbeddingError(
                    f"{encoding} rows at dim {dim} (or ids) are {need_value} bytes, over Redis' "
                    f"assumed hash-max-ziplist-value {max_value}: set hash-max-ziplist-value >= "
                    f"{need_value} in redis.conf, or use a smaller encoding"
                ) from exc
            return max_entries
        if max_entries < 1:
            raise EmbeddingError(
                f"this Redis has hash-max-ziplist-entries {max_entries}, so no hash is ever "
                f"compact and rows would cost several times the memory: set it to "
                f"{DEFAULT_MAX_ENTRIES} (the default) in redis.conf"
            )
        if need_value > max_value:
            if not self.configure_redis:
                raise EmbeddingError(
                    f"{encoding} rows at dim {dim} (or ids) are {need_value} bytes, over this "
                    f"Redis' hash-max-ziplist-value {max_value}, so buckets would lose the compact "
                    f"encoding (several times the memory): set hash-max-ziplist-value >= "
                    f"{need_value} in redis.conf, or allow the store to set it "
                    "(STREAMRANK_EMBEDDING_CONFIGURE_REDIS=true)"
                )
            await self.redis.config_set("hash-max-ziplist-value", need_value)
            logger.warning(
                "CONFIG SET hash-max-ziplist-value %s (was %s) so %s rows at dim %s stay compact; "
                "CONFIG SET does not survive a restart: put it in redis.conf too",
                need_value,
                max_value,
                encoding,
                dim,
            )
        return max_entries

    async def _write_rows(
        self,
        version: str,
        table: str,
        ids: list[str],
        encoded: npt.NDArray[np.uint8],
        buckets: npt.NDArray[np.int64],
        *,
        progress: bool,
    ) -> int:
        """One HSET per bucket, pipelined in batches of about ``publish_batch_rows`` rows."""
        _order, unique, groups = group_by_bucket(buckets)
        flat = encoded.tobytes()
        width = encoded.shape[1]
        max_rows = 0
        pipe = self.redis.pipeline(transaction=False)
        pending = 0
        with tqdm(
            total=len(ids), unit="row", desc=f"publish {version}/{table}", disable=not progress
        ) as bar:
            for bucket, positions in zip(unique.tolist(), groups, strict=True):
                mapping = {ids[p]: flat[p * width : (p + 1) * width] for p in positions.tolist()}
                max_rows = max(max_rows, len(mapping))
                pipe.hset(keys.embedding_bucket(version, table, bucket), mapping=mapping)
                pending += len(mapping)
                if pending >= self.publish_batch_rows:
                    await pipe.execute()
                    bar.update(pending)
                    pending = 0
            if pending:
                await pipe.execute()
                bar.update(pending)
        return max_rows

    async def _is_compact(self, version: str, table: str, buckets: npt.NDArray[np.int64]) -> bool:
        """Whether the fullest bucket kept the compact encoding (one OBJECT ENCODING call)."""
        if len(buckets) == 0:
            return True
        fullest = int(np.bincount(buckets).argmax())
        enc = await self.redis.object("encoding", keys.embedding_bucket(version, table, fullest))
        return enc in (b"ziplist", b"listpack", "ziplist", "listpack")

    # --- read ------------------------------------------------------------------------------

    async def table_meta(self, version: str, table: str) -> TableMeta:
        """The table's metadata, read from Redis (and remembered); UnknownVersion when absent."""
        check_name("version", version)
        check_name("table", table)
        try:
            raw = await self.redis.hgetall(keys.embedding_meta(version, table))
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise RedisUnavailable(
                f"Redis did not answer reading {version}/{table} meta: {exc}"
            ) from exc
        if not raw:
            published = await self.versions()
            hint = (
                f"version {version!r} has no table {table!r}"
                if version in published
                else f"published versions: {', '.join(published) or 'none'}"
            )
            raise UnknownVersion(
                f"embedding table {table!r} of version {version!r} is not published ({hint}); "
                "publish it first or pick a published version"
            )
        meta = _parse_meta(version, table, cast(dict[bytes, bytes], raw))
        self._metas[(version, table)] = meta
        return meta

    async def cached_meta(self, version: str, table: str) -> TableMeta:
        """The table's metadata as this process last read it (read from Redis the first time)."""
        meta = self._metas.get((version, table))
        return meta if meta is not None else await self.table_meta(version, table)

    async def fetch_encoded(
        self, table: str, unique_ids: Sequence[str], *, version: str
    ) -> EncodedRows:
        """Encoded rows of distinct ids: ONE round trip for the whole batch.

        Raises UnknownVersion when the table is not (or no longer) published.
        """
        meta = await self.cached_meta(version, table)
        for _attempt in range(2):
            try:
                pid, rows = await self._fetch(meta, unique_ids)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                raise RedisUnavailable(f"Redis did not answer an embedding fetch: {exc}") from exc
            if pid is not None and pid.decode() == meta.publish_id:
                assert rows is not None
                return rows
            # Deleted, or deleted and republished since we cached its meta: re-read it.
            self._metas.pop((version, table), None)
            meta = await self.table_meta(version, table)
        raise EmbeddingError(f"{version}/{table} changed twice during one fetch; retry")

    async def _fetch(
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
        if self.fetch_mode == "script":
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
            pid, blob, flags = await self._fetch_pipeline(meta, asked, buckets)
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

    async def _fetch_pipeline(
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

    async def lookup(self, table: str, ids: Sequence[str], *, version: str) -> FloatMatrix:
        """``float32[len(ids), dim]`` rows of ``ids`` (may repeat; unknown ids get the OOV row)."""
        pos: dict[str, int] = {}
        inverse = [pos.setdefault(i, len(pos)) for i in ids]  # dedupe, remembering positions
        unique = list(pos)
        rows = await self.fetch_encoded(table, unique, version=version)
        decoded = rows.decode()  # [u, dim], OOV rows filled in
        missing = int(len(unique) - rows.found.sum())
        if len(unique) == len(ids):
            self.oov_total += missing
            return decoded
        index = np.array(inverse, dtype=np.intp)  # [n]
        if missing:
            self.oov_total += int((~rows.found[index]).sum())
        return decoded[index]

    # --- versions --------------------------------------------------------------------------

    async def versions(self) -> list[str]:
        """Published embedding versions, sorted."""
        try:
            members = await self.redis.smembers(keys.embedding_versions())
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise RedisUnavailable(
                f"Redis did not answer listing embedding versions: {exc}"
            ) from exc
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)

    async def delete_version(self, version: str, *, force: bool = False) -> int:
        """Delete every key of ``version`` (SCAN + UNLINK in batches); returns keys deleted.

        That includes the model keys ``streamrank publish`` wrote (dense weights, config). The
        metas go first, so a concurrent reader sees UnknownVersion rather than half a table.
        Refuses a version the scoring worker may serve, the active one (``sr:model:active``) or
        one in the canary split (``sr:model:split``), unless ``force``.
        """
        check_name("version", version)
        try:
            return await self._delete_version(version, force=force)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise RedisUnavailable(
                f"Redis failed while deleting version {version!r} ({exc}); run the delete again "
                "(it resumes: every step is idempotent)"
            ) from exc

    async def _delete_version(self, version: str, *, force: bool) -> int:
        active, split = await self.redis.mget([keys.active_model(), keys.model_split()])
        if active is not None and _text(active) == version and not force:
            raise EmbeddingError(
                f"version {version!r} is the active model version; activate another first "
                "(or pass force)"
            )
        if split is not None and version in _split_versions(_text(split)) and not force:
            raise EmbeddingError(
                f"version {version!r} is in the canary split {keys.model_split()} "
                f"({_text(split)!r}); take it out of the split first (or pass force)"
            )
        known = version in await self.versions()
        # The model keys go first: without its config a version no longer counts as published,
        # so neither `activate` nor a scoring worker can pick it up while its rows disappear.
        deleted = int(
            await self.redis.unlink(keys.model_config(version), keys.model_dense(version))
        )
        deleted += await self._delete_matching(keys.embedding_meta_pattern(version))
        deleted += await self._delete_matching(keys.embedding_version_pattern(version))
        await self.redis.srem(keys.embedding_versions(), version)
        if not known and deleted == 0:
            raise UnknownVersion(f"embedding version {version!r} is not published; nothing deleted")
        for key in [k for k in self._metas if k[0] == version]:
            del self._metas[key]
        return deleted

    async def _delete_matching(self, pattern: str, *, batch: int = 1000) -> int:
        deleted = 0
        chunk: list[bytes] = []
        async for key in self.redis.scan_iter(match=pattern, count=batch):
            chunk.append(key)
            if len(chunk) >= batch:
                deleted += await self.redis.unlink(*chunk)
                chunk = []
        if chunk:
            deleted += await self.redis.unlink(*chunk)
        return deleted
