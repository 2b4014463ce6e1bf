"""Which model versions serve, and switching between them without a restart.

The watcher polls ``sr:model:active`` and ``sr:model:split`` (one MGET) about once a second.
When the target changes it loads the scorers of versions it does not hold yet from Redis,
warms the embedding cache for them with the ids recently served, and only then swaps the one
:class:`Serving` reference the worker reads at the start of each batch: a batch is scored
entirely by the state it started with, and no request waits for a load.

A version without a usable retriever (trained without one, or its index fails to load) still
serves: it is left out of :attr:`Serving.retrievers`, logged and counted
(``streamrank_scoring_retrieval_unavailable``), and its requests without items get the
hot-item pool. A retriable error (Redis down) fails the switch, which the next poll retries.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from scoring.model.canary import Split, assign, parse_split
from scoring.model.versions import read_pointers
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.protocols import EmbeddingSource, Retriever, Scorer
from streamrank import keys
from streamrank.errors import StreamrankError
from streamrank.runtime import tasks

logger = logging.getLogger(__name__)

Loader = Callable[[str], Awaitable[Scorer] | Scorer]
# A version's retriever, or None when the version ships no index.
RetrieverLoader = Callable[[str], Awaitable[Retriever | None] | Retriever | None]


@dataclass(frozen=True, slots=True)
class Serving:
    """An immutable serving state: the split, a scorer for each version in it and a retriever
    for each version whose index could be loaded (absent: retrieval falls back)."""

    split: Split
    scorers: Mapping[str, Scorer]
    source: str  # "setting", "split" or "pointer": where the split came from
    retrievers: Mapping[str, Retriever] = field(default_factory=dict)

    def assign(self, user_ids: Sequence[str]) -> list[str]:
        return assign(user_ids, self.split)


class RecentIds:
    """The most recently served item ids (bounded): what a new version's cache is warmed with.

    Only every ``sample_every``-th batch is recorded: a sample of the traffic finds the hot
    ids just as well, at a fraction of the cost on the hot path."""

    def __init__(self, capacity: int, *, sample_every: int = 8) -> None:
        self._capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._every = max(1, sample_every)
        self._calls = 0

    def add(self, ids: Iterable[str]) -> None:
        self._calls += 1
        if self._capacity <= 0 or (self._calls - 1) % self._every:
            return
        store = self._ids
        for item_id in ids:
            store[item_id] = None
            store.move_to_end(item_id)
        while len(store) > self._capacity:
            store.popitem(last=False)

    def newest(self) -> list[str]:
        return list(reversed(self._ids))


def target_split(
    static: str | None, pointer: str | None, split_text: str | None
) -> tuple[Split, str] | None:
    """The split to serve: the setting wins, then ``sr:model:split``, then ``sr:model:active``."""
    if static:
        return parse_split(static), "setting"
    if split_text:
        return parse_split(split_text), "split"
    if pointer:
        return ((pointer, 1.0),), "pointer"
    return None


class VersionWatcher:
    """Keeps :attr:`current` in line with the pointers in Redis."""

    def __init__(
        self,
        *,
        redis: aioredis.Redis,
        loader: Loader,
        embeddings: EmbeddingSource,
        metrics: ScoringMetrics,
        static_split: str | None = None,
        recent: RecentIds | None = None,
        warm_top_k: int = 10_000,
        poll_s: float = 1.0,
        retriever_loader: RetrieverLoader | None = None,
    ) -> None:
        self._redis = redis
        self._loader = loader
        self._retriever_loader = retriever_loader
        self._embeddings = embeddings
        self._metrics = metrics
        self._static = static_split
        self.recent = recent if recent is not None else RecentIds(warm_top_k)
        self._warm_top_k = warm_top_k
        self._poll_s = poll_s
        self.current: Serving | None = None
        self._failed: dict[tuple[tuple[str, float], ...], str] = {}
        self._task: asyncio.Task[None] | None = None

    async def _read_pointers(self) -> tuple[str | None, str | None]:
        return await read_pointers(self._redis)

    async def _load(self, version: str) -> Scorer:
        scorer = self._loader(version)
        if inspect.isawaitable(scorer):
            scorer = await scorer
        return scorer

    async def _load_retrievers(
        self, versions: Iterable[str], held: Mapping[str, Retriever]
    ) -> dict[str, Retriever]:
        """The retrievers of ``versions``: held ones kept, new ones loaded; a version whose
        index cannot be loaded is left out (its requests fall back to the hot-item pool)."""
        out: dict[str, Retriever] = {}
        for version in versions:
            if version in held:
                out[version] = held[version]
                continue
            if self._retriever_loader is None:
                continue
            try:
                found = self._retriever_loader(version)
                if inspect.isawaitable(found):
                    found = await found
            except StreamrankError as exc:
                if exc.retriable:
                    raise  # Redis is down: the whole switch is tried again at the next poll
                self._no_retriever(version, "load_failed", str(exc))
                continue
            except Exception as exc:  # the version still serves: retrieval falls back
                logger.exception("the retrieval index of %s cannot be loaded", version)
                self._no_retriever(version, "load_failed", repr(exc))
                continue
            if found is None:
                self._no_retriever(
                    version,
                    "absent",
                    "it has no retrieval model; train a version with one (`streamrank train` "
                    "without --no-retrieval), publish and activate it",
                )
            else:
                out[version] = found
        return out

    def _no_retriever(self, version: str, reason: str, why: str) -> None:
        """Log and count a version that serves without a retriever."""
        logger.error(
            "model version %s serves without retrieval (its requests without items get the "
            "hot-item pool): %s",
            version,
            why,
        )
        self._metrics.retrieval_unavailable.labels(reason).inc()

    async def refresh(self) -> bool:
        """One poll; returns True when the serving state changed. Raises on Redis errors."""
        pointer, split_text = (None, None) if self._static else await self._read_pointers()
        target = target_split(self._static, pointer, split_text)
        if target is None:
            return False
        split, source = target
        if self.current is not None and self.current.split == split:
            return False
        held = self.current.scorers if self.current is not None else {}
        scorers: dict[str, Scorer] = {}
        try:
            for version, _ in split:
                scorers[version] = held[version] if version in held else await self._load(version)
            warm_ids = self.recent.newest()[: self._warm_top_k]
            for version in scorers:
                if version not in held and warm_ids:
                    await self._embeddings.warm(version, keys.ITEM_TABLE, warm_ids)
        except StreamrankError as exc:
            if self._failed.get(split) != str(exc):
                logger.error(
                    "cannot switch to %s: %s; still serving %s", split, exc, self.describe()
                )
                self._failed[split] = str(exc)
            return False
        held_retrievers = self.current.retrievers if self.current is not None else {}
        retrievers = await self._load_retrievers(scorers, held_retrievers)
        previous = self.describe()
        self.current = Serving(split=split, scorers=scorers, source=source, retrievers=retrievers)
        self._failed.pop(split, None)
        self._metrics.set_split(split)
        self._metrics.version_switches.inc()
        logger.info("serving %s (from %s); was %s", self.describe(), source, previous)
        return True

    def describe(self) -> str:
        if self.current is None:
            return "nothing"
        return ",".join(f"{v}:{w:g}" for v, w in self.current.split)

    async def run(self) -> None:
        """Poll until cancelled; Redis errors are logged and retried at the next poll."""
        while True:
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning(
                    "model pointer poll failed (%s); retrying in %.1fs", exc, self._poll_s
                )
            await asyncio.sleep(self._poll_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="scoring-version-watcher")

    async def stop(self) -> None:
        if self._task is not None:
            await tasks.cancel_and_wait([self._task], what="scoring version watcher")
            self._task = None
