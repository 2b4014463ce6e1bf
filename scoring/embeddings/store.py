"""The embedding store: compressed rows in Redis hash buckets, versioned, one round trip per batch.

Layout (see streamrank.keys and docs/embeddings.md): rows of ``(version, table)`` are spread
over ``buckets`` hashes ``sr:{emb:<version>:<table>:<shard>}:<bucket>`` (field = raw id, value =
the encoded row, scoring.embeddings.codec), few enough rows each to stay in Redis' compact
ziplist/listpack encoding, grouped into ``shards`` hash tags so a cluster spreads a table over
its nodes; ``sr:{emb:<version>:<table>}:meta`` is written last and marks the table published.
Rows upserted later live in the table's overlay (scoring.embeddings.overlay). :class:`EmbeddingStore` is the one object callers hold; it publishes through
:mod:`scoring.embeddings.publish`, reads through :mod:`scoring.embeddings.fetch`, and removes a
version's keys (the refusal to delete a serving version is the model registry's:
:func:`scoring.model.registry.delete_version`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Any, cast

import numpy as np

from scoring.embeddings.codec import FloatMatrix
from scoring.embeddings.fetch import RowFetcher
from scoring.embeddings.meta import EncodedRows, FetchMode, PublishReport, TableMeta, parse_meta
from scoring.embeddings.overlay import OverlayWriter, UpsertReport
from scoring.embeddings.publish import TablePublisher
from scoring.embeddings.validate import check_name
from streamrank import keys
from streamrank.errors import ConfigError, EmbeddingError, UnknownVersion
from streamrank.redis.client import client_for_url, redis_client, unlink_matching
from streamrank.redis.errors import redis_call
from streamrank.settings import Settings

logger = logging.getLogger(__name__)

__all__ = [
    "EmbeddingStore",
    "EncodedRows",
    "FetchMode",
    "PublishReport",
    "TableMeta",
    "UpsertReport",
]


class EmbeddingStore:
    """Publish and read versioned embedding tables in Redis.

    ``redis`` must return bytes (``decode_responses=False``). Use :meth:`from_url` to let the
    store own its client (then ``async with`` / :meth:`close` closes it).
    """

    def __init__(
        self,
        *,
        redis: Any,
        fetch_mode: FetchMode = "script",
        configure_redis: bool = True,
        publish_batch_rows: int = 20_000,
        bucket_fill: float = 0.6,
        max_bucket_rows: int = 64,
        shards: int = 16,
        owns_client: bool = False,
    ) -> None:
        if redis.get_connection_kwargs().get("decode_responses"):
            raise ConfigError("EmbeddingStore needs a Redis client with decode_responses=False")
        if fetch_mode not in ("script", "pipeline"):
            raise ConfigError(f"fetch_mode must be 'script' or 'pipeline', got {fetch_mode!r}")
        if not 0 < bucket_fill <= 1:
            raise ConfigError(f"bucket_fill must be in (0, 1], got {bucket_fill}")
        if shards < 1:
            raise ConfigError(f"shards must be >= 1, got {shards}")
        # Any: redis-py's stubs type replies as str, ours are bytes (decode_responses=False).
        self.redis: Any = redis
        self.fetch_mode = fetch_mode
        self._owns_client = owns_client
        self._fetcher = RowFetcher(redis=redis, mode=fetch_mode)
        self._publisher = TablePublisher(
            redis=redis,
            delete_matching=self._delete_matching,
            configure_redis=configure_redis,
            publish_batch_rows=publish_batch_rows,
            bucket_fill=bucket_fill,
            # HGET scans a compact hash linearly, so fuller buckets make every lookup slower
            # while saving little memory; 64 is the middle of the measured trade-off
            # (docs/embeddings.md#redis-layout).
            max_bucket_rows=max_bucket_rows,
            # Shards (hash tags) per table: how many cluster slots, hence up to how many
            # masters, one table spreads over; a batch reads at most this many per fetch.
            shards=shards,
        )
        # Publishing a new, immutable table: TablePublisher.publish (refused if it exists).
        self.publish = self._publisher.publish
        self._overlay = OverlayWriter(redis=redis, table_meta=self.table_meta)
        self._metas: dict[tuple[str, str], TableMeta] = {}
        self.oov_total = 0  # unknown ids served the OOV row (per requested occurrence)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> EmbeddingStore:
        """A store owning its own client (closed by :meth:`close`)."""
        client_kwargs = kwargs.pop("client_kwargs", {})
        client = client_for_url(url, decode_responses=False, **client_kwargs)
        return cls(redis=client, owns_client=True, **kwargs)

    @classmethod
    def from_settings(cls, settings: Settings) -> EmbeddingStore:
        """A store owning a client on the settings' Redis (timeouts, TLS)."""
        return cls(
            redis=redis_client(settings.redis),
            owns_client=True,
            fetch_mode=settings.embeddings.fetch_mode,
            configure_redis=settings.embeddings.configure_redis,
            shards=settings.embeddings.shards,
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

    async def table_meta(self, version: str, table: str) -> TableMeta:
        """The table's metadata, read from Redis (and remembered); UnknownVersion when absent."""
        check_name("version", version)
        check_name("table", table)
        with redis_call(f"reading the meta of {version}/{table}"):
            raw = await self.redis.hgetall(keys.embedding_meta(version, table))
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
        meta = parse_meta(version, table, cast(dict[bytes, bytes], raw))
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
            with redis_call("an embedding fetch"):
                pid, rows = await self._fetcher.fetch(meta, unique_ids)
            if pid is not None and pid.decode() == meta.publish_id:
                assert rows is not None
                return rows
            # Deleted, or deleted and republished since we cached its meta: re-read it.
            self._metas.pop((version, table), None)
            meta = await self.table_meta(version, table)
        raise EmbeddingError(f"{version}/{table} changed twice during one fetch; retry")

    async def upsert(
        self, table: str, ids: Sequence[str], matrix: Any, *, version: str
    ) -> UpsertReport:
        """Write rows of new or changed ids into the overlay of a published table (validated
        against and encoded with its dim and codec); the next fetch reads them."""
        return await self._overlay.upsert(table, ids, matrix, version=version)

    async def overlay_id(self, version: str, table: str) -> str:
        """The table's overlay id as its meta says ("" when it has none or is not published)."""
        with redis_call(f"reading the overlay id of {version}/{table}"):
            value = await self.redis.hget(keys.embedding_meta(version, table), "overlay_id")
        return value.decode() if isinstance(value, bytes) else (value or "")

    async def overlay_info(self, version: str, table: str) -> dict[str, Any]:
        """``overlay_id`` ("" for none) and ``overlay_rows`` (distinct ids upserted)."""
        with redis_call(f"reading the overlay of {version}/{table}"):
            ovid, rows = await self.redis.hmget(
                keys.embedding_meta(version, table), "overlay_id", "overlay_rows"
            )
        return {"overlay_id": ovid.decode() if ovid else "", "overlay_rows": int(rows or 0)}

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

    async def versions(self) -> list[str]:
        """Published embedding versions, sorted."""
        with redis_call("listing embedding versions"):
            members = await self.redis.smembers(keys.embedding_versions())
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)

    async def delete_version_keys(self, version: str) -> tuple[bool, int]:
        """Remove every embedding key of ``version`` (SCAN + UNLINK in batches, on every master
        of a cluster): the metas first, then the shards' publish ids, so a concurrent reader
        sees UnknownVersion rather than half a table, then the rows, then its entry in the
        version set; the rows include the overlay. Returns (whether it was listed, keys
        deleted). Idempotent: a run that died part-way is completed by the next."""
        check_name("version", version)
        known = version in await self.versions()
        deleted = await self._delete_matching(keys.embedding_meta_pattern(version))
        deleted += await self._delete_matching(keys.embedding_publish_id_pattern(version))
        deleted += await self._delete_matching(keys.embedding_version_pattern(version))
        await self.redis.srem(keys.embedding_versions(), version)
        for key in [k for k in self._metas if k[0] == version]:
            del self._metas[key]
        return known, deleted

    async def _delete_matching(self, pattern: str, *, batch: int = 1000) -> int:
        return int(await unlink_matching(self.redis, pattern, batch=batch))
