"""Ranking one micro-batch: sequences -> embeddings -> DIN -> results (no Kafka here).

One Redis round trip fetches every user's sequence; requests are grouped by the model version
that serves them, and each group makes one embedding lookup for the union of its candidate and
history ids and one forward. Failures never escape: Redis trouble gives degraded replies with
fallback scores and feeds the circuit breaker.

Every Redis wait of a batch is bounded by the batch's earliest deadline: a Redis that hangs
(paused, overloaded, a network stall) costs a request at most its budget, then it is answered
degraded (``redis_unavailable``), never later; a Redis back within the budget costs only
latency. A request with less time left than Redis usually takes (``DeadlineMargin``) is
answered ``expired`` at once, and no deadline bounds the wait below the margin's
``min_wait_ms`` (half the budget), so that one request does not cut its whole batch short.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from schemas import RankRequest, RankResult, reasons
from scoring.model.side import SideArrays
from scoring.serving import replies
from scoring.serving.assemble import assemble, gather, split_scores
from scoring.serving.breaker import CircuitBreaker
from scoring.serving.features import ServedFeatures, served_features, side_arrays
from scoring.serving.margin import DeadlineMargin
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.protocols import EmbeddingSource, FeatureSource, Scorer
from scoring.serving.served_log import degraded_record, served_record
from scoring.serving.watcher import RecentIds, Serving
from streamrank import clock, keys
from streamrank.errors import DependencyUnavailable, StreamrankError
from streamrank.redis import errors as redis_errors
from streams.reader import FeatureQuery

logger = logging.getLogger(__name__)

ForwardMode = Literal["batched", "per_request"]
# What a Redis outage looks like from redis-py and the layers above it.
REDIS_FAILURES: tuple[type[BaseException], ...] = (
    DependencyUnavailable,
    asyncio.TimeoutError,
    *redis_errors.TRANSIENT,
)


@dataclass(frozen=True, slots=True)
class Incoming:
    """A valid request with when it was produced (Kafka timestamp) and received, epoch ms."""

    request: RankRequest
    produced_ms: int
    received_ms: int


@dataclass(slots=True)
class Ranked:
    """A reply and, for model-scored requests, the what-the-model-saw record."""

    result: RankResult
    served: dict[str, Any] | None = None


@dataclass(slots=True)
class _Group:
    version: str
    members: list[int] = field(default_factory=list)


def forward(
    scorer: Scorer,
    hist: np.ndarray,
    hist_mask: np.ndarray,
    cands: np.ndarray,
    cand_mask: np.ndarray,
    side: SideArrays | None = None,
    *,
    mode: ForwardMode,
) -> np.ndarray:
    """``[B, C]`` scores, one call for the batch or one per request (trimmed to its own sizes)."""
    if mode == "batched" or hist.shape[0] == 1:
        return np.asarray(scorer.score(hist, hist_mask, cands, cand_mask, side), dtype=np.float32)
    out = np.zeros(cand_mask.shape, dtype=np.float32)  # [B, C]
    hist_len = np.maximum(hist_mask.sum(axis=1), 1)
    cand_len = cand_mask.sum(axis=1)
    for b in range(hist.shape[0]):
        h, c = int(hist_len[b]), int(cand_len[b])
        one = None
        if side is not None:
            one = SideArrays(
                None if side.codes is None else side.codes[b : b + 1],
                None if side.dense is None else side.dense[b : b + 1, :c],
                None if side.actions is None else side.actions[b : b + 1, :h],
            )
        out[b, :c] = scorer.score(
            hist[b : b + 1, :h],
            hist_mask[b : b + 1, :h],
            cands[b : b + 1, :c],
            cand_mask[b : b + 1, :c],
            one,
        )[0]
    return out


class RankService:
    """Scores micro-batches; keyword-only construction, no I/O of its own beyond its sources."""

    def __init__(
        self,
        *,
        features: FeatureSource,
        embeddings: EmbeddingSource,
        serving: Callable[[], Serving | None],
        breaker: CircuitBreaker,
        metrics: ScoringMetrics,
        sequence_length: int,
        forward_mode: ForwardMode = "batched",
        log_served: bool = False,
        recent: RecentIds | None = None,
        clock_ms: Callable[[], int] = clock.now_ms,
        margin: DeadlineMargin | None = None,
    ) -> None:
        self._features = features
        self._embeddings = embeddings
        self._serving = serving
        self._breaker = breaker
        self._metrics = metrics
        self._sequence_length = sequence_length
        self._mode: ForwardMode = forward_mode
        self._log_served = log_served
        self._recent = recent
        self._clock_ms = clock_ms
        self._margin = margin or DeadlineMargin(cap_ms=0.0)
        self._cut_by_deadline = 0
        self._cut_logged_at = float("-inf")

    # --- the batch --------------------------------------------------------------------------

    async def rank(self, batch: Sequence[Incoming], *, deadlines: Sequence[int]) -> list[Ranked]:
        """One reply per request, in order. ``deadlines`` are epoch ms per request."""
        start = time.perf_counter()
        arrival = self._clock_ms()
        out: list[Ranked | None] = [None] * len(batch)
        live: list[int] = []
        expired: list[int] = []
        too_late = arrival + self._margin.ms
        for i, incoming in enumerate(batch):
            if deadlines[i] <= too_late:
                expired.append(i)
                out[i] = Ranked(self._result(incoming, (), "", True, reasons.EXPIRED, {}))
            else:
                live.append(i)
        if expired and self._log_served:
            routed = self._routed([batch[i] for i in expired])
            for i, version in zip(expired, routed or (), strict=True):
                ranked = out[i]
                assert ranked is not None
                ranked.served = self._degraded_served(batch[i], version, ranked.result)
        if live:
            # One request near its deadline must not cut its batch-mates' wait to nothing.
            until = max(min(deadlines[i] for i in live), arrival + int(self._margin.min_wait_ms))
            ranked_live = await self._rank_live([batch[i] for i in live], start, until)
            for i, ranked in zip(live, ranked_live, strict=True):
                out[i] = ranked
        self._metrics.breaker_state.set(int(self._breaker.state))
        return [r for r in out if r is not None]

    def _within(self, until_ms: int) -> asyncio.Timeout:
        """Bounds a Redis wait by the batch's deadline (``TimeoutError`` when it passes)."""
        return asyncio.timeout(max(0.0, (until_ms - self._clock_ms()) / 1000))

    async def _rank_live(
        self, batch: Sequence[Incoming], start: float, until_ms: int
    ) -> list[Ranked]:
        serving = self._serving()
        if serving is None:
            return await self._fallback(batch, reasons.NO_MODEL, start, until_ms)
        users = [b.request.user_id for b in batch]
        routed = serving.assign(users)
        if not self._breaker.allow():
            return await self._fallback(batch, reasons.BREAKER_OPEN, start, None, routed=routed)
        t0 = time.perf_counter()
        as_of = [b.request.as_of_ms(b.produced_ms) for b in batch]
        specs = [serving.scorers[v].features for v in set(routed)]
        queries = [
            FeatureQuery(u, t, b.request.items) for u, t, b in zip(users, as_of, batch, strict=True)
        ]
        counters = any(s.counters for s in specs)
        try:
            async with self._within(until_ms):
                reads = await self._features.read_batch(
                    queries,
                    counters=counters,
                    # item categories feed the category counter; user attributes their family
                    attributes=counters or any(s.has("attributes") for s in specs),
                )
        except REDIS_FAILURES as exc:
            return await self._redis_failed(batch, exc, start, until_ms, routed)
        t_seq = time.perf_counter() - t0
        groups: dict[str, _Group] = {}
        for i, version in enumerate(routed):
            groups.setdefault(version, _Group(version)).members.append(i)
        scores: list[list[float] | None] = [None] * len(batch)
        versions: list[str] = [""] * len(batch)
        events: list[list[Any]] = [[] for _ in batch]
        served: list[ServedFeatures | None] = [None] * len(batch)
        t_lookup = t_forward = 0.0
        try:
            for group in groups.values():
                t_l, t_f = await self._score_group(
                    group, serving.scorers[group.version], batch, reads, as_of, until_ms,
                    scored=(scores, versions, events, served),
                )  # fmt: skip
                t_lookup += t_l
                t_forward += t_f
        except REDIS_FAILURES as exc:
            return await self._redis_failed(batch, exc, start, until_ms, routed)
        except Exception as exc:
            return await self._scoring_failed(batch, exc, start, until_ms, routed)
        self._breaker.record_success()
        self._margin.observe((t_seq + t_lookup) * 1000)
        stages = {
            "sequence_fetch": t_seq * 1000,
            "embedding_lookup": t_lookup * 1000,
            "forward": t_forward * 1000,
        }
        out = []
        for i, incoming in enumerate(batch):
            score_row = scores[i] or []
            result = self._result(incoming, score_row, versions[i], False, None, stages, start)
            record = None
            if self._log_served:
                record = served_record(
                    incoming.request, versions[i], events[i], score_row, result.served_at,
                    latency_ms=_latency_ms(result), features=served[i],
                )  # fmt: skip
            out.append(Ranked(result, record))
        return out

    async def _score_group(
        self,
        group: _Group,
        scorer: Scorer,
        batch: Sequence[Incoming],
        reads: Sequence[Any],
        as_of: Sequence[int],
        until_ms: int,
        *,
        scored: tuple[list[Any], list[str], list[list[Any]], list[ServedFeatures | None]],
    ) -> tuple[float, float]:
        """Score the requests one version serves: its spec's features, one embedding lookup,
        one forward; fills ``scored`` (scores, versions, events, served features) in place and
        returns the lookup and forward seconds."""
        scores, versions, events, served = scored
        idx = group.members
        spec = scorer.features
        length = min(spec.sequence_length, self._sequence_length)
        for i in idx:
            events[i] = list(reads[i].user.sequence)[-length:]
            served[i] = served_features(spec, as_of[i], batch[i].request.context, reads[i])
        assembled = assemble(
            [[e.item_id for e in events[i]] for i in idx],
            [batch[i].request.items for i in idx],
            max_history=length,
        )
        side = side_arrays(
            spec, [served[i] for i in idx], width=assembled.cand_mask.shape[1],  # type: ignore[misc]
            actions=[[e.action for e in events[i]] for i in idx],
            hist_width=assembled.hist_mask.shape[1],
        )  # fmt: skip
        t1 = time.perf_counter()
        async with self._within(until_ms):
            rows = await self._embeddings.lookup(
                group.version, keys.ITEM_TABLE, assembled.unique_ids
            )
        t2 = time.perf_counter()
        hist, cands = gather(rows, assembled)
        probs = forward(
            scorer, hist, assembled.hist_mask, cands, assembled.cand_mask, side, mode=self._mode
        )  # [B, C]
        t3 = time.perf_counter()
        for i, row in zip(idx, split_scores(probs, assembled), strict=True):
            scores[i], versions[i] = row, group.version
        if self._recent is not None:
            self._recent.add(assembled.unique_ids)
        return t2 - t1, t3 - t2

    # --- degradation ------------------------------------------------------------------------

    async def _scoring_failed(
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
            return await self._fallback(
                batch, reasons.MODEL_UNAVAILABLE, start, until_ms, routed=routed
            )
        logger.exception("scoring a batch of %d failed; serving popularity fallback", len(batch))
        return await self._fallback(batch, reasons.INTERNAL_ERROR, start, until_ms, routed=routed)

    def _routed(self, batch: Sequence[Incoming]) -> list[str] | None:
        """The version each request is routed to by the current split (None: no model)."""
        serving = self._serving()
        return None if serving is None else serving.assign([b.request.user_id for b in batch])

    def _degraded_served(
        self, incoming: Incoming, version: str, result: RankResult
    ) -> dict[str, Any]:
        return degraded_record(
            incoming.request, version, result.scores, result.served_at,
            reason=result.reason, latency_ms=_latency_ms(result),
        )  # fmt: skip

    async def _redis_failed(
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
            return await self._fallback(
                batch, reasons.REDIS_UNAVAILABLE, start, None, routed=routed
            )
        self._breaker.record_failure()
        logger.warning(
            "Redis failed for a batch of %d (%s: %s); degraded replies",
            len(batch),
            type(exc).__name__,
            exc,
        )
        return await self._fallback(
            batch, reasons.REDIS_UNAVAILABLE, start, until_ms, routed=routed
        )

    async def _fallback(
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
            result = self._result(incoming, row.tolist(), "", True, reason, {}, start)
            served = (
                self._degraded_served(incoming, routed[n], result)
                if self._log_served and routed is not None
                else None
            )
            out.append(Ranked(result, served))
        return out

    def _result(
        self,
        incoming: Incoming,
        scores: Sequence[float],
        version: str,
        degraded: bool,
        reason: str | None,
        stages: Mapping[str, float],
        start: float | None = None,
    ) -> RankResult:
        request = incoming.request
        served_at = self._clock_ms()
        timings = {"queue_wait": float(max(0, incoming.received_ms - incoming.produced_ms))}
        timings.update({k: round(v, 3) for k, v in stages.items()})
        if start is not None:
            timings["total"] = round(
                (time.perf_counter() - start) * 1000 + timings["queue_wait"], 3
            )
        if degraded and not scores and request.items:
            scores = replies.neutral_scores(len(request.items)).tolist()
        return RankResult(
            request_id=request.request_id,
            user_id=request.user_id,
            items=request.items,
            scores=tuple(float(s) for s in scores),
            model_version=version,
            degraded=degraded,
            reason=reason,
            timings_ms=timings,
            served_at=served_at,
        )


def _latency_ms(result: RankResult) -> float | None:
    """Request produced -> reply built, as the reply's timings say."""
    timings = result.timings_ms
    value = timings.get("total", timings.get("queue_wait"))
    return None if value is None else float(value)
