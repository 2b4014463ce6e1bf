"""The scoring process's local hot-row cache in front of the embedding store.

Lookup of a batch: dedupe ids -> cache -> ONE Redis round trip for all misses -> fill the
cache -> decode the batch in one vectorised pass -> assemble ``float32[len(ids), dim]``.

The cache holds *encoded* rows (the bytes Redis returned) by default, not decoded float32:
within the same byte budget an int8 row (36 B at dim 32) is 3.5x smaller than its float32
form, so more rows fit and fewer lookups pay a round trip, while decoding a 150-row batch is a
few microseconds of numpy. ``hold="decoded"`` keeps float32 bytes instead (for the
comparison in ``streamrank bench embeddings``; see docs/embeddings.md for the figures).

Cache keys are ``publish_id + "\x1f" + id``: every publish of a ``(version, table)`` writes a
new random publish id (hex) into the table's meta, so a new version never reads another
version's rows, and a version deleted and published again under the same name never reads the
rows of its first publish (a batch with misses finds out from the fetch reply; its cached rows
are then fetched again). A publish id has no ``\x1f``, so the first one splits a key
unambiguously. Keys are strings rather than ``(publish_id, id)`` tuples because Python caches a
string's hash and recomputes a tuple's on every dict operation (docs/benchmarks.md).

With an overlay (rows upserted after the publish, scoring.embeddings.overlay) the prefix is
the *generation* ``publish_id.overlay_id``: a fetch reply says which overlay id its rows were
read under, and the cache re-reads the meta's overlay id at most every ``overlay_check_ms``
when a batch is served from the cache alone. A new overlay id changes every key, so rows an
upsert replaced, and unknown ids cached as the OOV row that may have gained one, are not
served again; the old entries age out through the policy.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Sequence
from itertools import repeat
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry

from scoring.embeddings.codec import FloatMatrix, decode_blobs, row_bytes
from scoring.embeddings.meta import generation
from scoring.embeddings.metrics import EmbeddingCacheMetrics
from scoring.embeddings.policy import make_policy
from scoring.embeddings.store import EmbeddingStore, EncodedRows, TableMeta
from streamrank.errors import ConfigError, EmbeddingError
from streamrank.settings import EmbeddingSettings

logger = logging.getLogger(__name__)

Hold = Literal["encoded", "decoded"]

# Python memory of one cache entry beyond its row bytes: the bytes object header, the key
# string (publish id + id), the ordered-dict slot and links, with room for long ids
# (docs/embeddings.md#the-local-cache).
ENTRY_OVERHEAD_BYTES = 250


def _entry_size(value: bytes) -> int:
    return len(value) + ENTRY_OVERHEAD_BYTES


def cache_keys(publish_id: str, ids: Sequence[str]) -> list[str]:
    """The cache key of each of ``ids`` in the publish ``publish_id``."""
    prefix = publish_id + "\x1f"
    return [prefix + i for i in ids]


class PopularitySource(Protocol):
    """Anything that scores item ids by popularity (e.g. streams' FeatureReader)."""

    async def item_popularity(self, item_ids: Sequence[str]) -> npt.NDArray[Any]: ...


def top_k(ids: Sequence[str], scores: npt.ArrayLike, k: int) -> list[str]:
    """The ``k`` ids with the highest scores, best first (ties: earlier id first)."""
    s = np.asarray(scores, dtype=np.float64)
    if s.shape != (len(ids),):
        raise ValueError(f"{len(ids)} ids but scores of shape {s.shape}")
    order = np.lexsort((np.arange(len(ids)), -s))[: max(0, k)]
    return [ids[i] for i in order.tolist()]


class CachedEmbeddings:
    """Byte-bounded local cache (W-TinyLFU or LRU) in front of an :class:`EmbeddingStore`."""

    def __init__(
        self,
        *,
        store: EmbeddingStore,
        cache_bytes: int,
        policy: str = "tinylfu",
        registry: CollectorRegistry | None = None,
        hold: Hold = "encoded",
        typical_row_bytes: int = 36,
        overlay_check_ms: float = 1000.0,
    ) -> None:
        if cache_bytes < 0:
            raise ConfigError(f"cache_bytes must be >= 0, got {cache_bytes}")
        if hold not in ("encoded", "decoded"):
            raise ConfigError(f"hold must be 'encoded' or 'decoded', got {hold!r}")
        self.store = store
        self.hold = hold
        self.cache_bytes = cache_bytes
        expected = max(16, cache_bytes // (typical_row_bytes + ENTRY_OVERHEAD_BYTES))
        try:
            self.policy = make_policy(
                policy, capacity=cache_bytes, size_of=_entry_size, expected_entries=expected
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self.metrics = EmbeddingCacheMetrics.build(registry)
        # Gauges are computed when scraped: nothing to update on the lookup path.
        self.metrics.hit_ratio.set_function(self._hit_ratio)
        self.metrics.bytes_used.set_function(lambda: self.policy.used)
        self.metrics.entries.set_function(lambda: len(self.policy))
        self._oov: dict[str, bytes] = {}  # the OOV row in the held form, per publish id
        if overlay_check_ms < 0:
            raise ConfigError(f"overlay_check_ms must be >= 0, got {overlay_check_ms}")
        self._overlay_check_s = overlay_check_ms / 1000
        # (version, table) -> (publish id, overlay id, monotonic time it was last learnt)
        self._overlays: dict[tuple[str, str], tuple[str, str, float]] = {}
        self._hits = 0
        self._misses = 0
        self._oov_count = 0
        self._evictions_seen = 0

    @classmethod
    def from_settings(
        cls,
        *,
        store: EmbeddingStore,
        embeddings: EmbeddingSettings,
        registry: CollectorRegistry | None = None,
    ) -> CachedEmbeddings:
        return cls(
            store=store,
            cache_bytes=embeddings.cache_bytes,
            policy=embeddings.cache_policy,
            registry=registry,
            hold=embeddings.cache_hold,
            typical_row_bytes=row_bytes(embeddings.encoding, 32),
            overlay_check_ms=embeddings.overlay_check_ms,
        )

    def _oov_value(self, meta: TableMeta) -> bytes:
        """The table's OOV row in the held form: one shared object per table (counted by identity)."""
        oov = self._oov.get(meta.publish_id)
        if oov is None:
            oov = meta.oov_blob if self.hold == "encoded" else meta.oov_row.tobytes()
            self._oov[meta.publish_id] = oov
        return oov

    def _held(self, rows: EncodedRows) -> list[bytes]:
        """Fetched rows as the cache holds them; unknown ids get the table's OOV row."""
        meta = rows.meta
        oov = self._oov_value(meta)
        if self.hold == "encoded":
            flat, width = rows.blob, meta.row_bytes
        else:
            flat, width = rows.decode().tobytes(), 4 * meta.dim
        return [
            flat[k * width : (k + 1) * width] if ok else oov
            for k, ok in enumerate(rows.found.tolist())
        ]

    def _generation(self, meta: TableMeta) -> str:
        """The generation this process last learnt for the table (its publish id alone when
        none was learnt for that publish)."""
        known = self._overlays.get((meta.version, meta.table))
        return generation(
            meta.publish_id, known[1] if known and known[0] == meta.publish_id else ""
        )

    def _observe(self, rows: EncodedRows) -> str:
        """Remember the overlay id a fetch observed; returns its rows' generation."""
        meta = rows.meta
        self._overlays[(meta.version, meta.table)] = (
            meta.publish_id,
            rows.overlay_id,
            time.monotonic(),
        )
        return rows.generation

    async def _recheck(self, meta: TableMeta) -> str:
        """The table's generation after re-reading the meta's overlay id, if it was last learnt
        ``overlay_check_ms`` ago or more: the check for batches served without a fetch."""
        key = (meta.version, meta.table)
        known = self._overlays.get(key)
        now = time.monotonic()
        if known is None or known[0] != meta.publish_id or now - known[2] >= self._overlay_check_s:
            overlay_id = await self.store.overlay_id(meta.version, meta.table)
            self._overlays[key] = (meta.publish_id, overlay_id, now)
        return self._generation(meta)

    async def lookup(self, version: str, table: str, ids: Sequence[str]) -> FloatMatrix:
        """``float32[len(ids), dim]``; ids may repeat; unknown ids get the table's OOV row."""
        return (await self.lookup_found(version, table, ids))[0]

    async def lookup_found(
        self, version: str, table: str, ids: Sequence[str]
    ) -> tuple[FloatMatrix, npt.NDArray[np.bool_]]:
        """:meth:`lookup` and, aligned with ``ids``, whether each id has a row of its own
        (False: it got the OOV row)."""
        unique = list(dict.fromkeys(ids))  # dedupe at C speed; positions only if ids repeat
        meta = await self.store.cached_meta(version, table)  # in memory after the first call
        prefix = self._generation(meta)
        keys = cache_keys(prefix, unique)
        got = self.policy.get_many(keys)
        miss = [k for k, v in enumerate(got) if v is None]
        if not miss and await self._recheck(meta) != prefix:
            prefix = self._generation(meta)  # an upsert became visible: read the batch again
            keys = cache_keys(prefix, unique)
            got = self.policy.get_many(keys)
            miss = [k for k, v in enumerate(got) if v is None]
        if miss:
            fetched = await self._fetch(table, [unique[k] for k in miss], version)
            if fetched.generation != prefix and len(miss) < len(unique):
                # Republished, or an overlay upsert became visible, since `prefix`: the hits
                # may be rows of the old publish (maybe another encoding) or rows an upsert
                # replaced, so fetch the whole batch again.
                republished = fetched.meta.publish_id != meta.publish_id
                meta = fetched.meta
                got, miss = [None] * len(unique), list(range(len(unique)))
                fetched = await self._fetch(table, unique, version)
                if republished and fetched.meta.publish_id != meta.publish_id:
                    raise EmbeddingError(
                        f"{version}/{table} changed twice during one lookup; retry"
                    )
            meta = fetched.meta
            keys = cache_keys(self._observe(fetched), unique)
            held = self._held(fetched)
            for k, value in zip(miss, held, strict=True):
                got[k] = value
            self.policy.put_many([keys[k] for k in miss], held)
        oov = self._oov.get(meta.publish_id)
        n_oov = sum(map(operator.is_, got, repeat(oov))) if oov is not None else 0
        self._account(hits=len(unique) - len(miss), misses=len(miss), oov=n_oov)
        rows: list[bytes] = got  # type: ignore[assignment]  # every slot is filled now
        if self.hold == "encoded":
            decoded = decode_blobs(rows, meta.encoding, meta.dim)  # [u, dim]
        else:
            decoded = np.frombuffer(b"".join(rows), dtype=np.float32).reshape(len(rows), meta.dim)
        found = np.fromiter((v is not oov for v in rows), dtype=bool, count=len(rows))  # [u]
        if len(unique) == len(ids):
            return (decoded if self.hold == "encoded" else decoded.copy()), found
        pos = {u: k for k, u in enumerate(unique)}
        where = np.array([pos[i] for i in ids], dtype=np.intp)
        return decoded[where], found[where]  # [n, dim], [n]

    async def _fetch(self, table: str, ids: list[str], version: str) -> EncodedRows:
        """One round trip for ``ids`` (distinct), timed into the fetch metrics."""
        started = time.perf_counter()
        fetched = await self.store.fetch_encoded(table, ids, version=version)
        self.metrics.fetch_seconds.observe(time.perf_counter() - started)
        self.metrics.fetch_rows.observe(len(ids))
        if fetched.overlay is not None:
            self.metrics.overlay_rows.inc(int(fetched.overlay.sum()))
        return fetched

    def _account(self, *, hits: int, misses: int, oov: int) -> None:
        m = self.metrics
        self._hits += hits
        self._misses += misses
        self._oov_count += oov
        if hits:
            m.hits.inc(hits)
        if misses:
            m.misses.inc(misses)
        if oov:
            m.oov.inc(oov)
        evicted = self.policy.evictions - self._evictions_seen
        if evicted:
            m.evictions.inc(evicted)
            self._evictions_seen = self.policy.evictions

    async def warm(self, version: str, table: str, ids: Sequence[str], *, chunk: int = 1000) -> int:
        """Preload rows of ``ids`` (most important first) while there is room; never evicts.

        One round trip per ``chunk`` ids; returns how many rows went into the cache.
        """
        loaded = 0
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), chunk):
            prefix = self._generation(await self.store.cached_meta(version, table))
            ids = unique[start : start + chunk]
            keys = cache_keys(prefix, ids)
            part = [u for u, k in zip(ids, keys, strict=True) if k not in self.policy]
            if not part:
                continue
            fetched = await self.store.fetch_encoded(table, part, version=version)
            held = self._held(fetched)
            keep = fetched.found.tolist()
            found = [u for u, ok in zip(part, keep, strict=True) if ok]
            found_keys = cache_keys(self._observe(fetched), found)  # the rows' own generation
            added = self.policy.preload(
                found_keys, [h for h, ok in zip(held, keep, strict=True) if ok]
            )
            loaded += added
            if added < len(found_keys):
                break  # full
        logger.info("warmed %s rows of %s/%s into the embedding cache", loaded, version, table)
        return loaded

    async def warm_by_popularity(
        self,
        version: str,
        table: str,
        source: PopularitySource,
        candidate_ids: Sequence[str],
        *,
        k: int,
    ) -> int:
        """Warm with the ``k`` most popular of ``candidate_ids`` by ``source.item_popularity``."""
        if k <= 0 or not candidate_ids:
            return 0
        scores = await source.item_popularity(list(candidate_ids))
        return await self.warm(version, table, top_k(list(candidate_ids), scores, k))

    def _hit_ratio(self) -> float:
        total = self._hits + self._misses
        return self._hits / total if total else 0.0

    def stats(self) -> dict[str, Any]:
        total = self._hits + self._misses
        return {
            "hits": self._hits,
            "misses": self._misses,
            "evictions": self.policy.evictions,
            "hit_ratio": self._hits / total if total else 0.0,
            "bytes": self.policy.used,
            "entries": len(self.policy),
            "oov": self._oov_count,
            "capacity_bytes": self.cache_bytes,
        }
