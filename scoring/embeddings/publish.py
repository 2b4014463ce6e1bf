"""Publishing an embedding table: validate everything first, write the rows in pipelined
batches (with a progress bar; one pipeline per node on a cluster), then each shard's copy of the
publish id, then the meta (last: a table without it is not published), then add the version to
the set of published versions. Buckets are sized to stay in Redis' compact hash encoding; the
Redis setting that bounds it is checked on every server (and set when allowed) first."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from redis.exceptions import ResponseError
from tqdm import tqdm

from scoring.embeddings.bucketing import choose_bucket_count, group_by_bucket, stable_hash
from scoring.embeddings.codec import encode_rows, row_bytes
from scoring.embeddings.meta import PublishReport
from scoring.embeddings.validate import check_ids, check_matrix, check_name, check_oov_row
from streamrank import keys
from streamrank.errors import EmbeddingError
from streamrank.redis.client import on_each_server
from streamrank.redis.errors import redis_call
from streamrank.redis.pipeline import NodePipeline

logger = logging.getLogger(__name__)

# Redis 6.2 defaults; CONFIG GET may be refused on managed Redis, then these are assumed.
DEFAULT_MAX_ENTRIES = 128
DEFAULT_MAX_VALUE = 64


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class TablePublisher:
    """Writes new, immutable ``(version, table)`` tables; ``delete_matching`` removes the keys
    an earlier publish that died before its meta left behind."""

    def __init__(
        self,
        *,
        redis: Any,
        delete_matching: Callable[[str], Awaitable[int]],
        configure_redis: bool,
        publish_batch_rows: int,
        bucket_fill: float,
        max_bucket_rows: int,
        shards: int,
    ) -> None:
        self.redis: Any = redis
        self._delete_matching = delete_matching
        self.configure_redis = configure_redis
        self.publish_batch_rows = publish_batch_rows
        self.bucket_fill = bucket_fill
        self.max_bucket_rows = max_bucket_rows
        self.shards = shards

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
        with redis_call(f"the publish of {version}/{table}", "run the publish again"):
            await self._refuse_published(version, table)
            max_entries = min(
                self.max_bucket_rows, await self._ensure_compact(encoding, width, id_list)
            )
            await self._remove_leftovers(version, table)
            n_buckets, n_shards, buckets = self._layout(id_list, max_entries)
            encoded = encode_rows(m32, encoding)  # [n, row_bytes]
            max_rows = await self._write_rows(
                version, table, id_list, encoded, buckets, n_shards, progress=progress
            )
            publish_id = uuid.uuid4().hex
            meta = {
                "dim": width,
                "encoding": encoding,
                "rows": n,
                "buckets": n_buckets,
                "shards": n_shards,
                "oov": encode_rows(oov, encoding)[0].tobytes(),
                "published_at": f"{time.time():.3f}",
                "publish_id": publish_id,
            }
            compact = await self._is_compact(version, table, buckets, n_shards)
            await self._write_meta(version, table, n_shards, publish_id, meta)
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
            shards=n_shards,
            max_bucket_rows=max_rows,
            compact=compact,
            seconds=time.perf_counter() - started,
        )

    async def _refuse_published(self, version: str, table: str) -> None:
        if await self.redis.exists(keys.embedding_meta(version, table)):
            raise EmbeddingError(
                f"table {table!r} of version {version!r} is already published and versions are "
                f"immutable; publish under a new version, or `streamrank embeddings delete "
                f"{version}` first"
            )

    async def _remove_leftovers(self, version: str, table: str) -> None:
        """Rows left by an earlier publish that died before its meta: never mix them in."""
        leftovers = await self._delete_matching(keys.embedding_table_pattern(version, table))
        if leftovers:
            logger.warning(
                "removed %s keys left by an unfinished publish of %s/%s",
                leftovers,
                version,
                table,
            )

    def _layout(self, ids: list[str], max_entries: int) -> tuple[int, int, npt.NDArray[np.int64]]:
        """``(buckets, shards, bucket of each row)``: enough buckets to stay compact."""
        hashes = stable_hash(ids)
        n_buckets = choose_bucket_count(
            hashes, max_entries=max_entries, target_fill=self.bucket_fill
        )
        n_shards = min(self.shards, n_buckets)
        buckets = (hashes % np.uint64(n_buckets)).astype(np.int64)  # [n]
        return n_buckets, n_shards, buckets

    async def _write_meta(
        self, version: str, table: str, shards: int, publish_id: str, meta: dict[str, Any]
    ) -> None:
        """Each shard's publish id, then the meta (which publishes the table), then the version."""
        pipe = NodePipeline(self.redis)
        for shard in range(shards):
            key = keys.embedding_publish_id(version, table, shard)
            pipe.add(key, "SET", key, publish_id)
        await pipe.execute()
        meta_key, versions_key = keys.embedding_meta(version, table), keys.embedding_versions()
        await self.redis.hset(meta_key, mapping=meta)
        await self.redis.sadd(versions_key, version)

    async def _ensure_compact(self, encoding: str, dim: int, ids: list[str]) -> int:
        """Make sure rows and ids fit the compact hash encoding; returns the max entries per hash."""
        need_value = max(row_bytes(encoding, dim), max(len(i.encode("utf-8")) for i in ids))
        try:
            # Every server, replicas too: the smallest limit is the one rows must fit.
            replies = await on_each_server(
                self.redis, "CONFIG GET", "hash-max-ziplist-*", replicas=True
            )
            confs = [{_text(k): v for k, v in reply.items()} for reply in replies]
            max_entries = min(
                int(c.get("hash-max-ziplist-entries", DEFAULT_MAX_ENTRIES)) for c in confs
            )
            max_value = min(int(c.get("hash-max-ziplist-value", DEFAULT_MAX_VALUE)) for c in confs)
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
            await on_each_server(
                self.redis, "CONFIG SET", "hash-max-ziplist-value", need_value, replicas=True
            )
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
        shards: int,
        *,
        progress: bool,
    ) -> int:
        """One HSET per bucket, pipelined in batches of about ``publish_batch_rows`` rows."""
        _order, unique, groups = group_by_bucket(buckets)
        flat = encoded.tobytes()
        width = encoded.shape[1]
        max_rows = 0
        pipe = NodePipeline(self.redis)
        pending = 0
        with tqdm(
            total=len(ids), unit="row", desc=f"publish {version}/{table}", disable=not progress
        ) as bar:
            for bucket, positions in zip(unique.tolist(), groups, strict=True):
                fields: list[Any] = []
                for p in positions.tolist():
                    fields += (ids[p], flat[p * width : (p + 1) * width])
                max_rows = max(max_rows, len(positions))
                key = keys.embedding_bucket(version, table, bucket, shards)
                pipe.add(key, "HSET", key, *fields)
                pending += len(positions)
                if pending >= self.publish_batch_rows:
                    await pipe.execute()
                    bar.update(pending)
                    pending = 0
            if pending:
                await pipe.execute()
                bar.update(pending)
        return max_rows

    async def _is_compact(
        self, version: str, table: str, buckets: npt.NDArray[np.int64], shards: int
    ) -> bool:
        """Whether the fullest bucket kept the compact encoding (one OBJECT ENCODING call)."""
        if len(buckets) == 0:
            return True
        fullest = int(np.bincount(buckets).argmax())
        key = keys.embedding_bucket(version, table, fullest, shards)
        enc = await self.redis.object("encoding", key)
        return enc in (b"ziplist", b"listpack", "ziplist", "listpack")
