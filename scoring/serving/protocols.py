"""The interfaces the scoring worker codes against.

The real implementations are ``streams.reader.FeatureReader``,
``scoring.embeddings.cache.CachedEmbeddings``, ``scoring.model.scorer.DinScorer``,
``scoring.model.retrieval.Retriever`` and ``scoring.serving.hotpool.HotPool``; these
Protocols only say what the worker calls, so its pure parts can be unit-tested without a broker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from scoring.model.features import FeatureSpec
from scoring.model.side import SideArrays


class SequenceEventLike(Protocol):
    """One event of a user's behaviour sequence (oldest first)."""

    @property
    def item_id(self) -> str: ...

    @property
    def ts(self) -> int: ...

    @property
    def event_id(self) -> str: ...


class FeatureSource(Protocol):
    """Read side of the feature store: one Redis round trip per call, whole batch."""

    async def read_batch(
        self, queries: Sequence[Any], *, counters: bool, attributes: bool
    ) -> Sequence[Any]: ...

    async def item_popularity(self, item_ids: Sequence[str]) -> np.ndarray: ...


class EmbeddingSource(Protocol):
    """Cached embedding lookup: dedupe, local cache, one round trip for the misses."""

    async def lookup(self, version: str, table: str, ids: Sequence[str]) -> np.ndarray: ...

    async def warm(self, version: str, table: str, ids: Sequence[str]) -> Any: ...

    def stats(self) -> Mapping[str, Any]: ...


@runtime_checkable
class FoundLookup(Protocol):
    """An embedding source that also says which ids have a row of their own (the rest got the
    OOV row): what cold start needs."""

    async def lookup_found(
        self, version: str, table: str, ids: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray]: ...


@runtime_checkable
class ItemAttributeSource(Protocol):
    """The item attribute table's read side (``streams.reader.FeatureReader``)."""

    async def item_attributes(self, item_ids: Sequence[str]) -> Mapping[str, Mapping[str, Any]]: ...


class Scorer(Protocol):
    """DIN serving forward: probabilities ``[B, C]``; masks are required. ``features``: the
    version's feature spec (what each request needs read and encoded)."""

    features: FeatureSpec

    def score(
        self,
        hist: np.ndarray,  # [B, L, d] float32
        hist_mask: np.ndarray,  # [B, L] bool
        cands: np.ndarray,  # [B, C, d] float32
        cand_mask: np.ndarray,  # [B, C] bool
        side: SideArrays | None = None,
    ) -> np.ndarray: ...


class Retriever(Protocol):
    """A version's retrieval model in process (``scoring.model.retrieval.Retriever``): rows of
    raw ids, user vectors from histories, approximate search and exact dot products."""

    @property
    def item_ids(self) -> tuple[str, ...]: ...  # row -> raw item id

    @property
    def categories(self) -> tuple[str, ...]: ...  # row -> primary category ("" unknown)

    @property
    def dim(self) -> int: ...

    def rows(self, ids: Sequence[str]) -> np.ndarray: ...  # [n] int64, -1 for an unknown id

    def user_vectors(self, histories: Sequence[Sequence[str]]) -> np.ndarray: ...  # [B, D]

    def search(
        self, users: np.ndarray, n: int
    ) -> tuple[np.ndarray, np.ndarray]: ...  # rows [B, n] int64 (-1 padded), scores [B, n]

    def dot(self, users: np.ndarray, rows: np.ndarray) -> np.ndarray: ...  # [B, C], -inf for -1

    def memory_bytes(self) -> int: ...


class HotItems(Protocol):
    """The hot-item pool: the most clicked items of late, best first (empty before its first
    refresh)."""

    def items(self) -> tuple[str, ...]: ...
