"""Final results of retrieval requests, served again while nothing they depend on changed.

A result is keyed by the user, the scene, the model version, ``top_k`` and ``exclude``
(:class:`ResultKey`), and stored with the user's *sequence version*: the newest event's
``(ts, event_id)`` of the read it was computed from (``"empty"`` for no event). A request is
answered from the cache only when its own read shows the same sequence version and the entry
is younger than the TTL: a new click changes the sequence version, a new active version
changes the key, so neither ever gets an old result.

Each worker keeps the latest result per key in a local LRU (``result_cache_entries``). With
``result_cache=redis`` the results are also written to Redis (:func:`streamrank.keys.
result_cache`, in the user's slot, TTL = the setting) after the reply is built, and the
misses of the local LRU are read from there in one round trip per batch, so the workers of a
group share them. When Redis is down, :meth:`ResultCache.latest` gives the local latest result
whatever its sequence version, within the TTL: the ``cached_fallback`` rung.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from schemas import RankRequest
from scoring.serving.breaker import REDIS_FAILURES
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.protocols import SequenceEventLike
from streamrank import keys
from streamrank.redis.errors import redis_call
from streamrank.redis.pipeline import NodePipeline
from streamrank.settings import CascadeSettings

logger = logging.getLogger(__name__)

EMPTY_SEQUENCE = "empty"
CacheMode = Literal["local", "redis", "off"]
_WARN_EVERY_S = 5.0


def sequence_version(events: Sequence[SequenceEventLike]) -> str:
    """The newest event's ``ts:event_id`` (events oldest first, as read), or ``"empty"``."""
    if not events:
        return EMPTY_SEQUENCE
    newest = events[-1]
    return f"{int(newest.ts)}:{newest.event_id}"


@dataclass(frozen=True, slots=True)
class ResultKey:
    """What a result answers: whose, in which scene, by which version, how many, without what."""

    user_id: str
    scene: str
    version: str
    top_k: int
    exclude: tuple[str, ...]  # sorted, each once

    @classmethod
    def of(cls, request: RankRequest, version: str, top_k: int) -> ResultKey:
        exclude = tuple(sorted(set(request.exclude)))
        return cls(request.user_id, request.scene, version, top_k, exclude)

    def variant(self) -> str:
        """A digest of the scene, ``top_k`` and ``exclude``: the Redis key's last part."""
        text = keys.FIELD_SEP.join((self.scene, str(self.top_k), *self.exclude))
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    def redis_key(self) -> str:
        return keys.result_cache(self.user_id, self.version, self.variant())


@dataclass(frozen=True, slots=True)
class CachedResult:
    """A reply's items and scores, the sequence version it was computed for, and for the served
    log the served features of its items (None when the version has none) and its cold-start
    map (the items scored with a cold-start vector -> the categories used; None: none)."""

    sequence: str
    items: tuple[str, ...]
    scores: tuple[float, ...]
    features: dict[str, Any] | None = None
    cold_start: dict[str, list[str]] | None = None

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "sequence": self.sequence,
                "items": self.items,
                "scores": self.scores,
                "features": self.features,
                "cold_start": self.cold_start,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> CachedResult:
        """Raises ``ValueError`` for a value that is not one of ours."""
        try:
            obj = orjson.loads(raw)
            items = tuple(str(i) for i in obj["items"])
            scores = tuple(float(s) for s in obj["scores"])
            cold = obj.get("cold_start")
            cold_start = (
                None if not cold else {str(i): [str(n) for n in v] for i, v in cold.items()}
            )
            result = cls(str(obj["sequence"]), items, scores, obj.get("features"), cold_start)
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a cached result: {exc}") from None
        if len(items) != len(scores):
            raise ValueError(f"cached result with {len(items)} items and {len(scores)} scores")
        return result


class LocalResults:
    """The latest result per key, at most ``entries`` (least recently used dropped), each
    served for ``ttl_s`` after it was stored."""

    def __init__(
        self, *, entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._entries = entries
        self._ttl_s = ttl_s
        self._clock = clock
        self._store: OrderedDict[ResultKey, tuple[float, CachedResult]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._store)

    def get(self, key: ResultKey) -> CachedResult | None:
        """The key's latest result while it is fresh (any sequence version)."""
        found = self._store.get(key)
        if found is None:
            return None
        stored_at, result = found
        if self._clock() - stored_at >= self._ttl_s:
            del self._store[key]
            return None
        self._store.move_to_end(key)
        return result

    def put(self, key: ResultKey, result: CachedResult) -> None:
        self._store[key] = (self._clock(), result)
        self._store.move_to_end(key)
        while len(self._store) > self._entries:
            self._store.popitem(last=False)


class ResultCache:
    """The local LRU, and with ``mode="redis"`` the group's copy in Redis; ``"off"`` keeps
    nothing."""

    def __init__(
        self,
        *,
        mode: CacheMode,
        ttl_s: float,
        entries: int,
        redis: Any = None,
        metrics: ScoringMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode == "redis" and redis is None:
            raise ValueError("result_cache=redis needs a Redis client")
        self.mode: CacheMode = mode
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._local = LocalResults(entries=entries, ttl_s=ttl_s, clock=clock)
        self._redis = redis
        self._metrics = metrics
        self._writes: set[asyncio.Task[None]] = set()
        self._warned_at = float("-inf")

    @classmethod
    def from_settings(
        cls, cascade: CascadeSettings, *, redis: Any, metrics: ScoringMetrics | None
    ) -> ResultCache:
        return cls(
            mode=cascade.result_cache,
            ttl_s=cascade.result_cache_ttl_s,
            entries=cascade.result_cache_entries,
            redis=redis if cascade.result_cache == "redis" else None,
            metrics=metrics,
        )

    async def lookup(
        self,
        wanted: Sequence[ResultKey],
        sequences: Sequence[str],
        *,
        bound: Callable[[], asyncio.Timeout],
    ) -> list[CachedResult | None]:
        """The fresh result of each key computed for the same sequence version, else None.
        Local first; with Redis, one round trip for the rest (bounded by ``bound()``; a Redis
        failure counts as misses)."""
        if self.mode == "off":
            return [None] * len(wanted)
        out: list[CachedResult | None] = []
        for key, sequence in zip(wanted, sequences, strict=True):
            found = self._local.get(key)
            out.append(found if found is not None and found.sequence == sequence else None)
        missing = [i for i, found in enumerate(out) if found is None]
        if self.mode == "redis" and missing:
            shared = await self._read([wanted[i] for i in missing], bound)
            for i, found in zip(missing, shared, strict=True):
                if found is not None and found.sequence == sequences[i]:
                    out[i] = found
                    self._local.put(wanted[i], found)
        if self._metrics is not None:
            hits = sum(found is not None for found in out)
            self._metrics.result_cache_hits.inc(hits)
            self._metrics.result_cache_misses.inc(len(out) - hits)
        return out

    def latest(self, key: ResultKey) -> CachedResult | None:
        """This worker's latest fresh result for ``key``, whatever its sequence version."""
        return None if self.mode == "off" else self._local.get(key)

    def store(self, results: Sequence[tuple[ResultKey, CachedResult]]) -> None:
        """Keep ``results``; with Redis, write them in the background (one round trip)."""
        if self.mode == "off" or not results:
            return
        for key, result in results:
            self._local.put(key, result)
        if self._metrics is not None:
            self._metrics.result_cache_entries.set(len(self._local))
        if self.mode == "redis":
            task = asyncio.create_task(self._write(results), name="result-cache-write")
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def drain(self) -> None:
        """Wait for the Redis writes in flight."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    async def _read(
        self, wanted: Sequence[ResultKey], bound: Callable[[], asyncio.Timeout]
    ) -> list[CachedResult | None]:
        pipe = NodePipeline(self._redis)
        for key in wanted:
            name = key.redis_key()
            pipe.add(name, "GET", name)
        try:
            async with bound():
                with redis_call("reading cached results"):
                    raw = await pipe.execute()
        except REDIS_FAILURES as exc:  # a cache read that fails is a miss
            self._redis_failed("reading", exc)
            return [None] * len(wanted)
        out: list[CachedResult | None] = []
        for key, value in zip(wanted, raw, strict=True):
            try:
                out.append(None if value is None else CachedResult.from_json(value))
            except ValueError as exc:
                logger.warning("ignoring the cached result at %s: %s", key.redis_key(), exc)
                out.append(None)
        return out

    async def _write(self, results: Sequence[tuple[ResultKey, CachedResult]]) -> None:
        pipe = NodePipeline(self._redis)
        for key, result in results:
            name = key.redis_key()
            pipe.add(name, "SET", name, result.to_json(), "PX", self._ttl_ms)
        try:
            with redis_call("writing cached results"):
                await pipe.execute()
        except REDIS_FAILURES as exc:  # the replies went out; only the sharing is lost
            self._redis_failed("writing", exc)

    def _redis_failed(self, doing: str, exc: BaseException) -> None:
        if self._metrics is not None:
            self._metrics.redis_errors.inc()
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            logger.warning(
                "%s cached results in Redis failed (%s: %s); serving without the shared cache",
                doing,
                type(exc).__name__,
                exc,
            )
