"""Degraded replies of a batch that could not be ranked normally, and when Redis is blamed.

Requests that brought candidates get item popularity from the counters when Redis answers that
before the deadline, else neutral scores; retrieval requests get the cascade's rungs (this
worker's cached result when Redis is the trouble, else the hot-item pool). A Redis failure
feeds the circuit breaker; a deadline that passed while Redis was silent does not (it proves
nothing about Redis), and is logged at most every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from schemas import RankResult, reasons
from scoring.serving import replies
from scoring.serving.breaker import REDIS_FAILURES, CircuitBreaker
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.pipeline import Cascade
from scoring.serving.protocols import FeatureSource
from scoring.serving.ranked import Incoming, Ranked, build_result, latency_ms, pick
from scoring.serving.served_log import degraded_record
from streamrank.errors import StreamrankError

logger = logging.getLogger(__name__)


class Fallbacks:
    """The fallback replies of :class:`~scoring.serving.service.RankService`."""

    def __init__(
        self,
        *,
        features: FeatureSource,
        breaker: CircuitBreaker,
        metrics: ScoringMetrics,
        cascade: Cascade,
        log_served: bool,
        clock_ms: Callable[[], int],
    ) -> None:
        self._features = features
        self._breaker = breaker
        self._metrics = metrics
        self._cascade = cascade
        self._log_served = log_served
        self._clock_ms = clock_ms
        self._cut_by_deadline = 0
        self._cut_logged_at = float("-inf")

    def _within(self, until_ms: int) -> asyncio.Timeout:
        return asyncio.timeout(max(0.0, (until_ms - self._clock_ms()) / 1000))

    async def scoring_failed(
        self,
        batch: Sequence[Incoming],
        exc: Exception,
        start: float,
        until_ms: int,
        routed: Sequence[str],
    ) -> list[Ranked]:
        """Redis answered but scoring failed: an unusable model version or a bug; the batch gets
        the popularity fallback. Call it from the ``except`` block (it logs the traceback)."""
        self._breaker.record_success()  # Redis answered: ends a half-open probe
        if isinstance(exc, StreamrankError):
            logger.error("model version unusable (%s); serving popularity fallback", exc)
            return await self.fallback(
                batch, reasons.MODEL_UNAVAILABLE, start, until_ms, routed=routed
            )
        logger.exception("scoring a batch of %d failed; serving popularity fallback", len(batch))
        return await self.fallback(batch, reasons.INTERNAL_ERROR, start, until_ms, routed=routed)

    def degraded_served(
        self, incoming: Incoming, version: str, result: RankResult
    ) -> dict[str, Any] | None:
        if not result.items:
            return None  # nothing was shown (a retrieval request answered without items)
        return degraded_record(
            incoming.request, version, result.scores, result.served_at,
            reason=result.reason, latency_ms=latency_ms(result), items=result.items,
        )  # fmt: skip

    async def redis_failed(
        self,
        batch: Sequence[Incoming],
        exc: BaseException,
        start: float,
        until_ms: int,
        routed: Sequence[str] | None = None,
    ) -> list[Ranked]:
        self._metrics.redis_errors.inc()
        if isinstance(exc, TimeoutError):
            # The batch's deadline passed while Redis was silent: no evidence that Redis is
            # down (a short budget on a slow moment, or a pause that may end within the next
            # batch's budget), so the breaker is left alone; logged at most every 5 s.
            self._breaker.release()
            self._cut_by_deadline += 1
            now = time.monotonic()
            if now - self._cut_logged_at >= 5.0:
                logger.warning(
                    "Redis did not answer before the deadline (%d batches since the last such "
                    "line); degraded replies",
                    self._cut_by_deadline,
                )
                self._cut_logged_at, self._cut_by_deadline = now, 0
            return await self.fallback(batch, reasons.REDIS_UNAVAILABLE, start, None, routed=routed)
        self._breaker.record_failure()
        logger.warning(
            "Redis failed for a batch of %d (%s: %s); degraded replies",
            len(batch),
            type(exc).__name__,
            exc,
        )
        return await self.fallback(batch, reasons.REDIS_UNAVAILABLE, start, until_ms, routed=routed)

    async def fallback(
        self,
        batch: Sequence[Incoming],
        reason: str,
        start: float,
        until_ms: int | None,
        *,
        routed: Sequence[str] | None = None,
    ) -> list[Ranked]:
        """Fallback replies: popularity (:meth:`_popularity`) for requests with candidates, the
        cascade's rungs (a cached result or the hot-item pool) for the others."""
        found = [i for i, b in enumerate(batch) if b.request.retrieves]
        if not found:
            return await self._popularity(batch, reason, start, until_ms, routed=routed)
        own = [i for i, b in enumerate(batch) if not b.request.retrieves]
        redis = reason in (reasons.REDIS_UNAVAILABLE, reasons.BREAKER_OPEN)
        pooled = self._cascade.degraded(
            pick(batch, found), None if routed is None else pick(routed, found), reason,
            stage="features" if redis else "model", start=start,
        )  # fmt: skip
        popular = await self._popularity(
            pick(batch, own), reason, start, until_ms,
            routed=None if routed is None else pick(routed, own),
        )  # fmt: skip
        out: list[Ranked | None] = [None] * len(batch)
        for positions, ranked in ((found, pooled), (own, popular)):
            for i, one in zip(positions, ranked, strict=True):
                out[i] = one
        return [r for r in out if r is not None]

    async def _popularity(
        self,
        batch: Sequence[Incoming],
        reason: str,
        start: float,
        until_ms: int | None,
        *,
        routed: Sequence[str] | None = None,
    ) -> list[Ranked]:
        """Item popularity from the counters when Redis answers before ``until_ms``, else (or
        when ``until_ms`` is None) a neutral ranking. ``routed``: the version each request was
        routed to (logged as degraded for it)."""
        if not batch:
            return []
        popularity: Mapping[str, float] | None = None
        if until_ms is not None and until_ms > self._clock_ms() and self._breaker.allow():
            ids = sorted({i for b in batch for i in b.request.items})
            try:
                async with self._within(until_ms):
                    values = await self._features.item_popularity(ids)
                popularity = dict(
                    zip(ids, np.asarray(values, dtype=np.float64).tolist(), strict=True)
                )
                self._breaker.record_success()
            except REDIS_FAILURES as exc:
                self._metrics.redis_errors.inc()
                self._breaker.record_failure()
                logger.warning("popularity fallback failed too (%s); neutral ranking", exc)
        out = []
        for n, incoming in enumerate(batch):
            items = incoming.request.items
            if popularity is None:
                row = replies.neutral_scores(len(items))
            else:
                row = replies.popularity_scores(np.array([popularity[i] for i in items]))
            result = self._result(incoming, row.tolist(), reason, start)
            served = (
                self.degraded_served(incoming, routed[n], result)
                if self._log_served and routed is not None
                else None
            )
            out.append(Ranked(result, served))
        return out

    def _result(
        self, incoming: Incoming, scores: Sequence[float], reason: str, start: float
    ) -> RankResult:
        return build_result(
            incoming, scores, "", degraded=True, reason=reason, stages={}, start=start,
            now_ms=self._clock_ms(),
        )  # fmt: skip
