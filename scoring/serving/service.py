"""Ranking one micro-batch (no Kafka here): one read, then the requests that bring their own
candidates through the deep model, and those that bring none through the cascade.

One Redis round trip reads every request's features as of its time. Requests with items are
grouped by the model version that serves them; each group makes one embedding lookup for the
union of its candidate and history ids and one forward (:mod:`.deep_rank`). Requests without
items go through the cascade (:mod:`.pipeline`: result cache, retrieval, filter, coarse, rank,
rerank, each with its budget and fallback rung). Failures never escape: Redis trouble gives
degraded replies with fallback scores and feeds the circuit breaker.

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
from typing import Any

from schemas import RankResult, reasons
from scoring.serving.breaker import REDIS_FAILURES, CircuitBreaker
from scoring.serving.cascade_stages import NoHotItems
from scoring.serving.coldstart import ColdMap, cold_for
from scoring.serving.deep_rank import DeepRanker, ForwardMode, GroupInputs, forward
from scoring.serving.fallback import Fallbacks
from scoring.serving.features import ServedFeatures, served_features
from scoring.serving.margin import DeadlineMargin
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.pipeline import Cascade
from scoring.serving.protocols import (
    EmbeddingSource,
    FeatureSource,
    HotItems,
    ItemAttributeSource,
    Scorer,
)
from scoring.serving.ranked import Incoming, Ranked, build_result, latency_ms, pick
from scoring.serving.result_cache import ResultCache
from scoring.serving.served_log import served_record
from scoring.serving.watcher import RecentIds, Serving
from streamrank import clock
from streamrank.settings import CascadeSettings
from streams.reader import FeatureQuery

__all__ = ["REDIS_FAILURES", "ForwardMode", "Incoming", "RankService", "Ranked", "forward"]

logger = logging.getLogger(__name__)


class RankService:
    """Ranks micro-batches; keyword-only construction, no I/O of its own beyond its sources.

    ``hot``: the hot-item pool (retrieval's fallback; empty by default); ``cascade``: the
    cascade's settings (defaults when None); ``result_cache``: the cache of retrieval results
    (a local one per the settings when None)."""

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
        hot: HotItems | None = None,
        cascade: CascadeSettings | None = None,
        result_cache: ResultCache | None = None,
    ) -> None:
        self._features = features
        self._serving = serving
        self._breaker = breaker
        self._metrics = metrics
        self._sequence_length = sequence_length
        self._log_served = log_served
        self._clock_ms = clock_ms
        self._margin = margin or DeadlineMargin(cap_ms=0.0)
        self._ranker = DeepRanker(
            embeddings=embeddings, mode=forward_mode, recent=recent,
            attributes=features if isinstance(features, ItemAttributeSource) else None,
            on_cold=metrics.cold_start_items.inc,
        )  # fmt: skip
        settings = cascade or CascadeSettings()
        if result_cache is None:
            result_cache = ResultCache(
                mode="off" if settings.result_cache == "off" else "local",
                ttl_s=settings.result_cache_ttl_s,
                entries=settings.result_cache_entries,
                metrics=metrics,
            )
        self.cascade = Cascade(
            settings=settings,
            hot=hot if hot is not None else NoHotItems(),
            cache=result_cache,
            ranker=self._ranker,
            features=features,
            metrics=metrics,
            sequence_length=sequence_length,
            log_served=log_served,
            clock_ms=clock_ms,
        )
        self._fallbacks = Fallbacks(
            features=features,
            breaker=breaker,
            metrics=metrics,
            cascade=self.cascade,
            log_served=log_served,
            clock_ms=clock_ms,
        )

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
                ranked.served = self._fallbacks.degraded_served(batch[i], version, ranked.result)
        if live:
            # One request near its deadline must not cut its batch-mates' wait to nothing.
            until = max(min(deadlines[i] for i in live), arrival + int(self._margin.min_wait_ms))
            ranked_live = await self._rank_live(
                pick(batch, live), start, until, pick(deadlines, live)
            )
            for i, ranked in zip(live, ranked_live, strict=True):
                out[i] = ranked
        self._metrics.breaker_state.set(int(self._breaker.state))
        return [r for r in out if r is not None]

    def _within(self, until_ms: int) -> asyncio.Timeout:
        """Bounds a Redis wait by the batch's deadline (``TimeoutError`` when it passes)."""
        return asyncio.timeout(max(0.0, (until_ms - self._clock_ms()) / 1000))

    async def _rank_live(
        self, batch: Sequence[Incoming], start: float, until_ms: int, deadlines: Sequence[int]
    ) -> list[Ranked]:
        serving = self._serving()
        if serving is None:
            return await self._fallbacks.fallback(batch, reasons.NO_MODEL, start, until_ms)
        routed = serving.assign([b.request.user_id for b in batch])
        if not self._breaker.allow():
            return await self._fallbacks.fallback(
                batch, reasons.BREAKER_OPEN, start, None, routed=routed
            )
        t0 = time.perf_counter()
        try:
            reads = await self._read(batch, serving, routed, until_ms)
        except REDIS_FAILURES as exc:
            return await self._fallbacks.redis_failed(batch, exc, start, until_ms, routed)
        t_seq = time.perf_counter() - t0
        own = [i for i, b in enumerate(batch) if not b.request.retrieves]
        found = [i for i, b in enumerate(batch) if b.request.retrieves]
        if not own:  # Redis answered; the cascade's own Redis trouble is one of its rungs
            self._breaker.record_success()
            self._margin.observe(t_seq * 1000)
        scored, retrieved = await asyncio.gather(
            self._score(
                pick(batch, own), pick(reads, own), pick(routed, own), serving,
                start, until_ms, t_seq,
            ),
            self._retrieve(
                pick(batch, found), pick(reads, found), pick(routed, found),
                pick(deadlines, found), serving, start, until_ms, t_seq,
            ),
        )  # fmt: skip
        out: list[Ranked | None] = [None] * len(batch)
        for positions, ranked in ((own, scored), (found, retrieved)):
            for i, one in zip(positions, ranked, strict=True):
                out[i] = one
        return [r for r in out if r is not None]

    async def _read(
        self, batch: Sequence[Incoming], serving: Serving, routed: Sequence[str], until_ms: int
    ) -> Sequence[Any]:
        """Every request's features as of its time, in one round trip (raises on Redis
        failures)."""
        specs = [serving.scorers[v].features for v in set(routed)]
        queries = [
            FeatureQuery(b.request.user_id, b.request.as_of_ms(b.produced_ms), b.request.items)
            for b in batch
        ]
        counters = any(s.counters for s in specs)
        async with self._within(until_ms):
            return await self._features.read_batch(
                queries,
                counters=counters,
                # item categories feed the category counter; user attributes their family
                attributes=counters or any(s.has("attributes") for s in specs),
            )

    async def _retrieve(
        self,
        batch: Sequence[Incoming],
        reads: Sequence[Any],
        routed: Sequence[str],
        deadlines: Sequence[int],
        serving: Serving,
        start: float,
        until_ms: int,
        t_seq: float,
    ) -> list[Ranked]:
        """The requests without candidates, through the cascade."""
        if not batch:
            return []
        jobs = [
            self.cascade.job(incoming, version, deadline)
            for incoming, version, deadline in zip(batch, routed, deadlines, strict=True)
        ]
        try:
            return await self.cascade.answer(
                jobs, reads, serving, start=start, bound=lambda: self._within(until_ms),
                sequence_ms=t_seq * 1000,
            )  # fmt: skip
        except Exception:
            logger.exception("the cascade failed for %d requests; hot-item pool", len(batch))
            return self.cascade.degraded(
                batch, routed, reasons.INTERNAL_ERROR, stage="model", start=start
            )

    async def _score(
        self,
        batch: Sequence[Incoming],
        reads: Sequence[Any],
        routed: Sequence[str],
        serving: Serving,
        start: float,
        until_ms: int,
        t_seq: float,
    ) -> list[Ranked]:
        """The requests that brought their candidates: the deep model per version."""
        if not batch:
            return []
        groups: dict[str, list[int]] = {}
        for i, version in enumerate(routed):
            groups.setdefault(version, []).append(i)
        scores: list[list[float] | None] = [None] * len(batch)
        events: list[list[Any]] = [[] for _ in batch]
        served: list[ServedFeatures | None] = [None] * len(batch)
        cold: ColdMap = {}
        t_lookup = t_forward = 0.0
        try:
            for version, members in groups.items():
                t_l, t_f = await self._score_group(
                    version, serving.scorers[version], members, batch, reads, until_ms,
                    scored=(scores, events, served), cold=cold,
                )  # fmt: skip
                t_lookup += t_l
                t_forward += t_f
        except REDIS_FAILURES as exc:
            return await self._fallbacks.redis_failed(batch, exc, start, until_ms, routed)
        except Exception as exc:
            return await self._fallbacks.scoring_failed(batch, exc, start, until_ms, routed)
        self._breaker.record_success()
        self._margin.observe((t_seq + t_lookup) * 1000)
        stages = {
            "sequence_fetch": t_seq * 1000,
            "embedding_lookup": t_lookup * 1000,
            "forward": t_forward * 1000,
        }
        out = []
        for i, incoming in enumerate(batch):
            result = self._result(incoming, scores[i] or [], routed[i], False, None, stages, start)
            record = None
            if self._log_served:
                features = served[i]
                if features is not None and incoming.request.top_k is not None:
                    features = features.for_items(incoming.request.items, result.items)
                history = [e.item_id for e in events[i]]
                record = served_record(
                    incoming.request, routed[i], events[i], result.scores, result.served_at,
                    latency_ms=latency_ms(result), features=features, items=result.items,
                    cold_start=cold_for(cold, history, result.items),
                )  # fmt: skip
            out.append(Ranked(result, record))
        return out

    async def _score_group(
        self,
        version: str,
        scorer: Scorer,
        members: Sequence[int],
        batch: Sequence[Incoming],
        reads: Sequence[Any],
        until_ms: int,
        *,
        scored: tuple[list[Any], list[list[Any]], list[ServedFeatures | None]],
        cold: ColdMap,
    ) -> tuple[float, float]:
        """Score the requests one version serves: its spec's features, one embedding lookup,
        one forward; fills ``scored`` (scores, events, served features) and ``cold`` (the ids
        scored with a cold-start vector) in place and returns the lookup and forward
        seconds."""
        scores, events, served = scored
        spec = scorer.features
        length = min(spec.sequence_length, self._sequence_length)
        for i in members:
            request = batch[i].request
            events[i] = list(reads[i].user.sequence)[-length:]
            as_of = request.as_of_ms(batch[i].produced_ms)
            served[i] = served_features(spec, as_of, request.context, reads[i])
        inputs = GroupInputs(
            histories=[[e.item_id for e in events[i]] for i in members],
            actions=[[e.action for e in events[i]] for i in members],
            candidates=[batch[i].request.items for i in members],
            served=[served[i] for i in members],  # type: ignore[misc]
            length=length,
        )
        result = await self._ranker.score(
            version, scorer, inputs, bound=lambda: self._within(until_ms)
        )
        for i, row in zip(members, result.scores, strict=True):
            scores[i] = row
        cold.update(result.cold)
        return result.lookup_s, result.forward_s

    # --- degradation ------------------------------------------------------------------------

    def _routed(self, batch: Sequence[Incoming]) -> list[str] | None:
        """The version each request is routed to by the current split (None: no model)."""
        serving = self._serving()
        return None if serving is None else serving.assign([b.request.user_id for b in batch])

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
        return build_result(
            incoming, scores, version, degraded=degraded, reason=reason, stages=stages,
            start=start, now_ms=self._clock_ms(),
        )  # fmt: skip
