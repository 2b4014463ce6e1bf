"""The ranking cascade of the requests that bring no candidates, after the batch's one read.

Per request: the result cache first (same user, scene, version and sequence version: the
stored reply, ``cached: true``, no stage runs); else, the requests of one version together,
retrieval (the version's index: user vectors, then the nearest ``retrieve`` items, merged with
the first ``hot_merge`` hot items) -> filter (the items of the history the model reads, per the
scene's rule; the request's ``exclude``) -> coarse (dot product with the user vector, best
``coarse``) -> rank (the deep model over the survivors: their features in one more read per
batch when the version uses counters, one embedding lookup, one forward) -> rerank (the scene's
category cap, ``top_k``).

Each stage runs against its budget and the request's deadline (:mod:`.budget`); the CPU stages
(search, the forward) run on a worker thread that is no longer waited for when its time is up.
The rungs: retrieval late, failing or without an index for the version -> the hot-item pool as
candidates (``retrieval_fallback``); rank late or failing -> the coarse order and scores
(``rank_skipped``); Redis down -> this worker's latest cached result within its TTL
(``cached_fallback``), else the hot pool (:meth:`Cascade.degraded`). Every rung is counted per
stage and reason (``streamrank_cascade_fallbacks_total``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas import RankRequest, reasons
from scoring.model.cascade import Widths, filter_candidates, merge_candidates
from scoring.serving import replies
from scoring.serving.breaker import REDIS_FAILURES
from scoring.serving.budget import StageBudgets, in_thread, thread_until, until
from scoring.serving.cascade_stages import (
    coarse_cut,
    rerank_stage,
    search,
    user_vectors,
    with_hot,
)
from scoring.serving.coldstart import cold_for
from scoring.serving.deep_rank import DeepRanker, GroupInputs
from scoring.serving.features import ServedFeatures, served_features
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.protocols import FeatureSource, HotItems, Retriever
from scoring.serving.ranked import Incoming, Ranked, build_result, latency_ms
from scoring.serving.result_cache import (
    EMPTY_SEQUENCE,
    CachedResult,
    ResultCache,
    ResultKey,
    sequence_version,
)
from scoring.serving.served_log import degraded_record, served_record
from scoring.serving.watcher import Serving
from streamrank.settings import CascadeSettings, SceneRule
from streams.reader import FeatureQuery

logger = logging.getLogger(__name__)

Bound = Callable[[], asyncio.Timeout]
_LOG_EVERY_S = 5.0
# The search loop stops before a search it would not finish in time; this covers the one
# search a misjudged estimate lets run past the end, so the users searched so far still count.
SEARCH_GRACE_S = 0.002


@dataclass(slots=True)
class Job:
    """One retrieval request on its way through the cascade."""

    incoming: Incoming
    version: str
    deadline_ms: int
    top_k: int
    rule: SceneRule
    key: ResultKey
    events: Sequence[Any] = ()  # the user's sequence as of the request, oldest first
    history: Sequence[Any] = ()  # cut to the version's sequence length
    sequence: str = EMPTY_SEQUENCE
    read: Any = None  # its features (the batch's read; the candidates' read before rank)
    candidates: list[str] = field(default_factory=list)
    user: np.ndarray | None = None  # [D]
    scores: np.ndarray | None = None  # aligned with candidates: coarse, then the deep model's
    served: ServedFeatures | None = None
    cold: dict[str, list[str]] = field(default_factory=dict)  # cold-start items -> categories
    stages: dict[str, float] = field(default_factory=dict)
    reason: str | None = None  # the first rung it fell to

    @property
    def request(self) -> RankRequest:
        return self.incoming.request

    @property
    def as_of_ms(self) -> int:
        return self.request.as_of_ms(self.incoming.produced_ms)

    def history_ids(self) -> list[str]:
        return [e.item_id for e in self.history]


class Cascade:
    """Answers retrieval requests: the cache, the stages and their fallback rungs."""

    def __init__(
        self,
        *,
        settings: CascadeSettings,
        hot: HotItems,
        cache: ResultCache,
        ranker: DeepRanker,
        features: FeatureSource,
        metrics: ScoringMetrics,
        sequence_length: int,
        log_served: bool = False,
        clock_ms: Callable[[], int],
    ) -> None:
        self._settings = settings
        self._budgets = StageBudgets.from_settings(settings)
        self._widths = Widths(settings.retrieve, settings.coarse, settings.rerank_window)
        self._hot = hot
        self.cache = cache
        self._ranker = ranker
        self._features = features
        self._metrics = metrics
        self._sequence_length = sequence_length
        self._log_served = log_served
        self._clock_ms = clock_ms
        self._late_logged: dict[str, tuple[float, int]] = {}

    def top_k(self, request: RankRequest) -> int:
        """The reply length: the request's, else its scene's, else the setting."""
        rule = self._settings.rule(request.scene)
        return request.top_k or rule.top_k or self._settings.top_k

    def job(self, incoming: Incoming, version: str, deadline_ms: int) -> Job:
        request = incoming.request
        top_k = self.top_k(request)
        rule = self._settings.rule(request.scene)
        key = ResultKey.of(request, version, top_k)
        return Job(incoming, version, deadline_ms, top_k, rule, key)

    # --- the batch --------------------------------------------------------------------------

    async def answer(
        self,
        jobs: Sequence[Job],
        reads: Sequence[Any],
        serving: Serving,
        *,
        start: float,
        bound: Bound,
        sequence_ms: float,
    ) -> list[Ranked]:
        """One reply per job, in order; ``reads``: their features from the batch's read,
        ``bound()`` limits a Redis wait to the batch's deadline."""
        for job, read in zip(jobs, reads, strict=True):
            spec = serving.scorers[job.version].features
            length = min(spec.sequence_length, self._sequence_length)
            job.read, job.events = read, list(read.user.sequence)
            job.history = job.events[-length:] if length > 0 else []
            job.sequence = sequence_version(job.events)
        found = await self.cache.lookup(
            [j.key for j in jobs], [j.sequence for j in jobs], bound=bound
        )
        todo = [job for job, hit in zip(jobs, found, strict=True) if hit is None]
        if todo:
            await self._stages(todo, serving)
        out: list[Ranked] = []
        fresh: list[tuple[ResultKey, CachedResult]] = []
        for job, hit in zip(jobs, found, strict=True):
            if hit is not None:
                out.append(self._from_cache(job, hit, start, sequence_ms))
                continue
            ranked, entry = self._reply(job, start, sequence_ms)
            out.append(ranked)
            if entry is not None:
                fresh.append((job.key, entry))
        self.cache.store(fresh)
        return out

    async def _stages(self, jobs: Sequence[Job], serving: Serving) -> None:
        groups: dict[str, list[Job]] = defaultdict(list)
        for job in jobs:
            groups[job.version].append(job)
        for version, group in groups.items():
            await self._retrieve(group, serving.retrievers.get(version))
        for job in jobs:
            self._filter(job)
        for version, group in groups.items():
            self._coarse(group, serving.retrievers.get(version))
        await self._rank(jobs, groups, serving)
        for job in jobs:
            self._rerank(job, serving.retrievers.get(job.version))

    # --- the stages -------------------------------------------------------------------------

    def _allowance_s(self, stage: str, group: Sequence[Job]) -> float:
        """The group's time for ``stage`` (the earliest deadline of its requests), seconds."""
        now = self._clock_ms()
        deadline = min(j.deadline_ms for j in group)
        return self._budgets.allowance_ms(stage, now_ms=now, deadline_ms=deadline) / 1000

    async def _retrieve(self, group: Sequence[Job], retriever: Retriever | None) -> None:
        t0 = time.perf_counter()
        hot = self._hot.items()
        if retriever is None:
            self._fall_back(group, "retrieval", reasons.RETRIEVAL_FALLBACK)
            for job in group:
                job.candidates = list(hot)
        else:
            end = t0 + self._allowance_s("retrieval", group)
            try:
                histories = [j.history_ids() for j in group]
                users = await in_thread(
                    functools.partial(user_vectors, retriever, histories),
                    timeout_s=end - time.perf_counter(),
                )  # [B, D]
                for job, user in zip(group, users, strict=True):
                    job.user = user
                found = await in_thread(
                    functools.partial(search, retriever, users, self._widths.retrieve, end=end),
                    timeout_s=end - time.perf_counter() + SEARCH_GRACE_S,
                )
            except Exception as exc:  # late or failing: the hot pool
                self._late("retrieval", exc, len(group))
                found = [None] * len(group)
            else:
                if None in found:  # out of time part-way: the rest fall back one by one
                    self._late("retrieval", TimeoutError(), found.count(None))
            late = [job for job, ids in zip(group, found, strict=True) if ids is None]
            if late:
                self._fall_back(late, "retrieval", reasons.RETRIEVAL_FALLBACK)
            s = self._settings
            for job, ids in zip(group, found, strict=True):
                job.candidates = (
                    list(hot)
                    if ids is None
                    else with_hot(ids, hot, retrieve=s.retrieve, hot_merge=s.hot_merge)
                )
        _timed(group, "retrieval", t0)

    def _filter(self, job: Job) -> None:
        t0 = time.perf_counter()
        # the history window the model reads (as offline), not all the worker stores
        seen = {e.item_id for e in job.history} if job.rule.filter_seen else set()
        exclude = set(job.request.exclude)
        job.candidates = filter_candidates(job.candidates, seen=seen, exclude=exclude)
        _timed([job], "filter", t0)

    def _coarse(self, group: Sequence[Job], retriever: Retriever | None) -> None:
        t0 = time.perf_counter()
        users = None
        if retriever is not None and all(j.user is not None for j in group):
            users = np.stack([j.user for j in group if j.user is not None])  # [B, D]
        cut = coarse_cut(retriever, users, [j.candidates for j in group], self._widths.coarse)
        for job, (items, scores) in zip(group, cut, strict=True):
            job.candidates, job.scores = items, scores
        _timed(group, "coarse", t0)

    async def _rank(
        self, jobs: Sequence[Job], groups: dict[str, list[Job]], serving: Serving
    ) -> None:
        """The deep model over each request's survivors; late or failing -> coarse order."""
        t0 = time.perf_counter()
        ends = {v: t0 + self._allowance_s("rank", g) for v, g in groups.items()}
        skipped = await self._candidate_reads(jobs, serving, ends)
        for version, group in groups.items():
            live = [j for j in group if j.candidates and id(j) not in skipped]
            if not live:
                continue
            scorer, end = serving.scorers[version], ends[version]
            for job in live:
                job.served = served_features(
                    scorer.features, job.as_of_ms, job.request.context, job.read
                )
            inputs = GroupInputs(
                histories=[j.history_ids() for j in live],
                actions=[[e.action for e in j.history] for j in live],
                candidates=[j.candidates for j in live],
                served=[j.served for j in live if j.served is not None],
                length=max(1, max(len(j.history) for j in live)),
            )
            try:
                scored = await self._ranker.score(
                    version, scorer, inputs, bound=until(end), offload=thread_until(end)
                )
            except Exception as exc:  # late or failing: the coarse order
                self._late("rank", exc, len(live))
                self._fall_back(live, "rank", reasons.RANK_SKIPPED)
                continue
            for job, row in zip(live, scored.scores, strict=True):
                job.scores = np.asarray(row, dtype=np.float32)
                job.cold = cold_for(scored.cold, job.history_ids(), job.candidates)
        _timed(jobs, "rank", t0)

    async def _candidate_reads(
        self, jobs: Sequence[Job], serving: Serving, ends: dict[str, float]
    ) -> set[int]:
        """The survivors' features for the versions whose model counts clicks: one round
        trip for the batch. Returns the ids of the jobs whose read failed (rank skipped)."""
        need = [j for j in jobs if j.candidates and serving.scorers[j.version].features.counters]
        if not need:
            return set()
        queries = [FeatureQuery(j.request.user_id, j.as_of_ms, j.candidates) for j in need]
        end = min(ends[j.version] for j in need)
        try:
            async with until(end)():
                found = await self._features.read_batch(queries, counters=True, attributes=True)
        except REDIS_FAILURES as exc:
            self._metrics.redis_errors.inc()
            self._late("rank", exc, len(need))
            self._fall_back(need, "rank", reasons.RANK_SKIPPED)
            return {id(j) for j in need}
        for job, read in zip(need, found, strict=True):
            job.read = read
        return set()

    def _rerank(self, job: Job, retriever: Retriever | None) -> None:
        t0 = time.perf_counter()
        scores = (
            job.scores if job.scores is not None else replies.neutral_scores(len(job.candidates))
        )
        shown, values = rerank_stage(
            retriever, job.candidates, scores,
            top_k=job.top_k, window=self._widths.rerank, category_cap=job.rule.category_cap,
        )  # fmt: skip
        if job.served is not None:
            job.served = job.served.for_items(job.candidates, shown)
        job.candidates, job.scores = shown, values
        _timed([job], "rerank", t0)

    # --- replies ----------------------------------------------------------------------------

    def _reply(
        self, job: Job, start: float, sequence_ms: float
    ) -> tuple[Ranked, CachedResult | None]:
        """The reply of a job the stages ran for, and what the cache keeps of it (None for a
        degraded one)."""
        degraded = job.reason is not None
        scores = job.scores if job.scores is not None else ()
        result = build_result(
            job.incoming, [float(s) for s in scores], job.version,
            degraded=degraded, reason=job.reason,
            stages={"sequence_fetch": sequence_ms, **job.stages}, start=start,
            now_ms=self._clock_ms(), items=job.candidates,
        )  # fmt: skip
        record = None
        cold = cold_for(job.cold, job.history_ids(), result.items) or None
        if self._log_served and result.items:
            if degraded:
                record = degraded_record(
                    job.request, job.version, result.scores, result.served_at,
                    reason=job.reason, latency_ms=latency_ms(result), items=result.items,
                )  # fmt: skip
            else:
                record = served_record(
                    job.request, job.version, job.history, result.scores, result.served_at,
                    latency_ms=latency_ms(result), features=job.served, items=result.items,
                    cold_start=cold,
                )  # fmt: skip
        if degraded:
            return Ranked(result, record), None
        features = None if job.served is None else job.served.to_json()
        return Ranked(result, record), CachedResult(
            job.sequence, result.items, result.scores, features, cold
        )

    def _from_cache(self, job: Job, hit: CachedResult, start: float, sequence_ms: float) -> Ranked:
        result = build_result(
            job.incoming, hit.scores, job.version, degraded=False, reason=None,
            stages={"sequence_fetch": sequence_ms}, start=start, now_ms=self._clock_ms(),
            items=hit.items, cached=True,
        )  # fmt: skip
        record = None
        if self._log_served and result.items:
            features = None if hit.features is None else ServedFeatures.from_json(hit.features)
            record = served_record(
                job.request, job.version, job.history, result.scores, result.served_at,
                latency_ms=latency_ms(result), features=features, items=result.items,
                cached=True, cold_start=hit.cold_start,
            )  # fmt: skip
        return Ranked(result, record)

    def degraded(
        self,
        batch: Sequence[Incoming],
        routed: Sequence[str] | None,
        reason: str,
        *,
        stage: str,
        start: float | None,
    ) -> list[Ranked]:
        """Replies when the batch cannot go through the stages (Redis down, breaker open, no
        model, the model failing): this worker's latest result for the request within the
        TTL when Redis is the trouble (``cached_fallback``), else the hot pool with
        ``reason``. ``routed``: each request's version (None: no model)."""
        hot = self._hot.items()
        redis_down = reason in (reasons.REDIS_UNAVAILABLE, reasons.BREAKER_OPEN)
        out = []
        for n, incoming in enumerate(batch):
            request = incoming.request
            version = None if routed is None else routed[n]
            top_k = self.top_k(request)
            latest = None
            if version is not None and redis_down:
                latest = self.cache.latest(ResultKey.of(request, version, top_k))
            if latest is not None:
                self._metrics.fallback(stage, reasons.CACHED_FALLBACK)
                result = build_result(
                    incoming, latest.scores, version or "", degraded=True,
                    reason=reasons.CACHED_FALLBACK, stages={}, start=start,
                    now_ms=self._clock_ms(), items=latest.items, cached=True,
                )  # fmt: skip
            else:
                self._metrics.fallback(stage, reason)
                kept = filter_candidates(hot, seen=(), exclude=set(request.exclude))
                items = merge_candidates([kept], limit=top_k)
                result = build_result(
                    incoming, replies.neutral_scores(len(items)).tolist(), "", degraded=True,
                    reason=reason, stages={}, start=start, now_ms=self._clock_ms(), items=items,
                )  # fmt: skip
            record = None
            if self._log_served and version is not None and result.items:
                record = degraded_record(
                    request, version, result.scores, result.served_at,
                    reason=result.reason, latency_ms=latency_ms(result), items=result.items,
                )  # fmt: skip
            out.append(Ranked(result, record))
        return out

    # --- bookkeeping ------------------------------------------------------------------------

    def _fall_back(self, jobs: Sequence[Job], stage: str, reason: str) -> None:
        """Each job fell to ``reason`` at ``stage``; a reply keeps the first rung it fell to."""
        self._metrics.fallback(stage, reason, len(jobs))
        for job in jobs:
            if job.reason is None:
                job.reason = reason

    def _late(self, stage: str, exc: BaseException, n: int) -> None:
        """Log a stage that fell back: at most one line per stage every few seconds (a late
        stage under load would log each batch), with the traceback of an unexpected error."""
        now = time.monotonic()
        logged_at, since = self._late_logged.get(stage, (float("-inf"), 0))
        since += n
        if now - logged_at < _LOG_EVERY_S:
            self._late_logged[stage] = (logged_at, since)
            return
        self._late_logged[stage] = (now, 0)
        expected = isinstance(exc, (TimeoutError, *REDIS_FAILURES))
        logger.warning(
            "cascade stage %s fell back for %d requests since the last such line (%s: %s)",
            stage,
            since,
            type(exc).__name__,
            exc or "out of time",
            exc_info=None if expected else exc,
        )


def _timed(jobs: Sequence[Job], stage: str, t0: float) -> None:
    """Each job's time in ``stage``: from ``t0`` to now, ms."""
    elapsed = (time.perf_counter() - t0) * 1000
    for job in jobs:
        job.stages[stage] = elapsed
