"""RankService's cascade on in-memory stand-ins (pure logic): a retrieval request goes through
retrieval, filter, coarse, rank and rerank; each fallback rung (late or failing retrieval,
rank late, Redis down, no model) gives its reason and is counted; the result cache answers a
repeat and never a new click or a new version."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from schemas import RankRequest, reasons
from scoring.model.cascade import best, filter_candidates, merge_candidates, rerank
from scoring.model.features import FeatureSpec
from scoring.serving.breaker import CircuitBreaker
from scoring.serving.budget import StageBudgets
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.result_cache import ResultCache
from scoring.serving.service import Incoming, RankService
from scoring.serving.watcher import Serving
from streamrank.settings import CascadeSettings
from streams.reader import FeatureQuery, ItemFeatures, RequestFeatures
from tests.unit.serving.cascade_fakes import (
    BrokenRetriever,
    BruteForceRetriever,
    SlowRetriever,
    StaticHot,
)
from tests.unit.serving.test_service import (
    Embeddings,
    Event,
    Features,
    MeanDotScorer,
    expected,
)

ITEMS = [f"i{k:02d}" for k in range(40)]
CATS = ["drama", "comedy", "action", "horror"]
CATEGORY = {item: CATS[k % 4] for k, item in enumerate(ITEMS)}
HOT = ("i39", "i38", "i01", "i37", "i36", "i35")
SEQ = {"u1": [Event("i01", 1, "e1"), Event("i02", 2, "e2"), Event("i03", 3, "e3")]}
FAR = 2**62
# Budgets far above what a loaded test host needs: only the tests about lateness set short ones.
SETTINGS = CascadeSettings(
    retrieve=20, coarse=8, rerank_window=6, top_k=4, scenes={"home": {"category_cap": 1}},
    budget_ms=60_000, budget_retrieval_ms=5_000, budget_filter_ms=5_000,
    budget_coarse_ms=5_000, budget_rank_ms=5_000, budget_rerank_ms=5_000,
)  # fmt: skip


class SlowScorer(MeanDotScorer):
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def score(self, *args: Any, **kw: Any) -> np.ndarray:
        time.sleep(self.delay_s)
        return super().score(*args, **kw)


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def serving(retriever: Any = None, scorer: Any = None, version: str = "v1") -> Serving:
    return Serving(
        split=((version, 1.0),),
        scorers={version: scorer or MeanDotScorer()},
        source="pointer",
        retrievers={} if retriever is None else {version: retriever},
    )


class Rig:
    """A RankService with a cascade, and what its tests look at."""

    def __init__(
        self,
        state: Serving | None,
        *,
        settings: CascadeSettings = SETTINGS,
        features: Features | None = None,
        cache_clock: FakeClock | None = None,
        embeddings: Embeddings | None = None,
        **kw: Any,
    ) -> None:
        self.state = state
        self.features = features or Features({k: list(v) for k, v in SEQ.items()}, {})
        self.metrics = ScoringMetrics()
        self.cache = ResultCache(
            mode="local", ttl_s=settings.result_cache_ttl_s, entries=100, metrics=self.metrics,
            clock=cache_clock or time.monotonic,
        )  # fmt: skip
        self.service = RankService(
            features=self.features,
            embeddings=embeddings or Embeddings(),
            serving=lambda: self.state,
            breaker=CircuitBreaker(failures=2, cooldown_s=60.0),
            metrics=self.metrics,
            sequence_length=3,
            log_served=True,
            hot=StaticHot(HOT),
            cascade=settings,
            result_cache=self.cache,
            **kw,
        )

    async def one(self, request: RankRequest, deadline: int = FAR) -> Any:
        incoming = Incoming(request, produced_ms=10_000, received_ms=10_005)
        (ranked,) = await self.service.rank([incoming], deadlines=[deadline])
        return ranked

    def fallbacks(self, stage: str, reason: str) -> float:
        return float(self.metrics.cascade_fallbacks.labels(stage, reason)._value.get())


def reference(
    retriever: BruteForceRetriever,
    history: Sequence[str],
    *,
    top_k: int = 4,
    cap: int = 0,
    exclude: Sequence[str] = (),
    rank: bool = True,
) -> tuple[list[str], np.ndarray]:
    """The cascade computed by hand from the pure functions and the fakes."""
    users = retriever.user_vectors([history])  # [1, D]
    rows, _ = retriever.search(users, SETTINGS.retrieve)
    found = [ITEMS[r] for r in rows[0] if r >= 0]
    cands = merge_candidates([found], limit=SETTINGS.retrieve)
    cands = filter_candidates(cands, seen=set(history), exclude=set(exclude))
    dots = retriever.dot(users, retriever.rows(cands)[None, :])[0]
    survivors, coarse = best(cands, dots, SETTINGS.coarse)
    scores = expected(list(history), survivors) if rank else coarse
    cats = [CATEGORY[i] for i in survivors]
    return rerank(
        survivors, scores, cats, top_k=top_k, window=SETTINGS.rerank_window, category_cap=cap
    )


def retriever() -> BruteForceRetriever:
    return BruteForceRetriever(ITEMS, [CATEGORY[i] for i in ITEMS])


HISTORY = ["i01", "i02", "i03"]


async def test_a_retrieval_request_goes_through_every_stage() -> None:
    rig = Rig(serving(retriever()))
    ranked = await rig.one(RankRequest("r1", "u1", scene="home", exclude=("i05",)))
    r = ranked.result
    items, scores = reference(retriever(), HISTORY, cap=1, exclude=["i05"])
    assert list(r.items) == items and len(r.items) == 4
    np.testing.assert_allclose(r.scores, scores, atol=1e-6)
    assert list(r.scores) == sorted(r.scores, reverse=True)
    assert not set(r.items) & {"i01", "i02", "i03", "i05"}  # seen and excluded
    assert not r.degraded and r.reason is None and not r.cached and r.model_version == "v1"
    assert {"retrieval", "filter", "coarse", "rank", "rerank"} <= set(r.timings_ms)
    record = ranked.served
    assert record["items"] == list(r.items) and record["scores"] == list(r.scores)
    assert record["sequence"]["item_ids"] == HISTORY and record["degraded"] is False


async def test_the_default_scene_uses_the_settings_top_k_and_no_cap() -> None:
    rig = Rig(serving(retriever()))
    r = (await rig.one(RankRequest("r1", "u1"))).result
    items, scores = reference(retriever(), HISTORY)
    assert list(r.items) == items
    np.testing.assert_allclose(r.scores, scores, atol=1e-6)
    r = (await rig.one(RankRequest("r2", "u1", top_k=2))).result
    assert list(r.items) == reference(retriever(), HISTORY, top_k=2)[0]


class ShortHistoryScorer(MeanDotScorer):
    features = FeatureSpec(sequence_length=2)


async def test_only_the_history_the_model_reads_is_filtered_as_offline() -> None:
    # The worker keeps 3 events, the model reads the newest 2: the filter drops those 2, as the
    # offline cascade does (its history window); the older i19 (the best for that history)
    # stays a candidate.
    sequence = [Event("i19", 1, "e1"), Event("i02", 2, "e2"), Event("i03", 3, "e3")]
    features = Features({"u2": sequence}, {})
    rig = Rig(serving(retriever(), ShortHistoryScorer()), features=features)
    r = (await rig.one(RankRequest("r1", "u2"))).result
    items, scores = reference(retriever(), ["i02", "i03"])
    assert list(r.items) == items and items[0] == "i19"
    np.testing.assert_allclose(r.scores, scores, atol=1e-6)


async def test_a_request_with_items_and_top_k_gets_its_best_items_sorted_once() -> None:
    rig = Rig(serving(retriever()))
    own = ("i10", "i11", "i10", "i12", "i13")
    r = (await rig.one(RankRequest("r1", "u1", own, top_k=2))).result
    want, values = best(own, expected(HISTORY, own), 2)
    assert list(r.items) == want and len(set(r.items)) == 2
    np.testing.assert_allclose(r.scores, values, atol=1e-6)
    assert "retrieval" not in r.timings_ms


async def test_retrieval_past_its_budget_falls_back_to_the_hot_pool() -> None:
    slow = SlowRetriever(ITEMS, [CATEGORY[i] for i in ITEMS], delay_s=1.0)
    settings = SETTINGS.model_copy(update={"budget_retrieval_ms": 30.0})
    rig = Rig(serving(slow), settings=settings)
    started = time.monotonic()
    ranked = await rig.one(RankRequest("r1", "u1"))
    assert time.monotonic() - started < 0.8  # it did not wait for the search
    r = ranked.result
    assert r.degraded and r.reason == reasons.RETRIEVAL_FALLBACK and r.model_version == "v1"
    pool = [i for i in HOT if i not in HISTORY]
    assert set(r.items) <= set(pool) and len(r.items) == 4
    np.testing.assert_allclose(r.scores, expected(HISTORY, r.items), atol=1e-6)  # DIN ranked
    assert rig.fallbacks("retrieval", reasons.RETRIEVAL_FALLBACK) == 1
    assert ranked.served["degraded"] is True and ranked.served["reason"] == r.reason


@pytest.mark.parametrize("index", ["missing", "broken"])
async def test_no_index_or_a_failing_one_falls_back_to_the_hot_pool(index: str) -> None:
    broken = BrokenRetriever(ITEMS) if index == "broken" else None
    rig = Rig(serving(broken))
    r = (await rig.one(RankRequest("r1", "u1"))).result
    assert r.reason == reasons.RETRIEVAL_FALLBACK and r.degraded
    pool = [i for i in HOT if i not in HISTORY]
    want, values = best(pool[: SETTINGS.coarse], expected(HISTORY, pool), 4)
    assert list(r.items) == want
    np.testing.assert_allclose(r.scores, values, atol=1e-6)
    assert rig.fallbacks("retrieval", reasons.RETRIEVAL_FALLBACK) == 1


async def test_a_deadline_too_close_for_retrieval_skips_it_without_searching() -> None:
    """Fake clock: the deadline leaves less than the later stages must have (filter, coarse,
    rerank: rank can be skipped), so retrieval gets no time at all and is not started."""
    now = [1_000_000]
    found = retriever()
    rig = Rig(serving(found), clock_ms=lambda: now[0])
    later = StageBudgets.from_settings(SETTINGS).after("retrieval")
    assert later == sum(SETTINGS.budgets_ms().values()) - (
        SETTINGS.budget_retrieval_ms + SETTINGS.budget_rank_ms
    )
    r = (await rig.one(RankRequest("r1", "u1"), deadline=now[0] + int(later) - 1)).result
    assert r.reason == reasons.RETRIEVAL_FALLBACK and found.searches == 0


async def test_rank_past_its_budget_gives_the_coarse_order() -> None:
    settings = SETTINGS.model_copy(update={"budget_rank_ms": 30.0})
    rig = Rig(serving(retriever(), SlowScorer(1.0)), settings=settings)
    started = time.monotonic()
    ranked = await rig.one(RankRequest("r1", "u1"))
    assert time.monotonic() - started < 0.8
    r = ranked.result
    assert r.degraded and r.reason == reasons.RANK_SKIPPED and r.model_version == "v1"
    items, scores = reference(retriever(), HISTORY, rank=False)
    assert list(r.items) == items
    np.testing.assert_allclose(r.scores, scores, atol=1e-6)
    assert rig.fallbacks("rank", reasons.RANK_SKIPPED) == 1
    assert ranked.served["degraded"] is True


async def test_redis_down_serves_the_fresh_cached_result_else_the_hot_pool() -> None:
    clock = FakeClock()
    rig = Rig(serving(retriever()), cache_clock=clock)
    first = (await rig.one(RankRequest("r1", "u1"))).result
    assert not first.degraded
    rig.features.fail_sequences = True
    ranked = await rig.one(RankRequest("r2", "u1"))
    r = ranked.result
    assert r.degraded and r.cached and r.reason == reasons.CACHED_FALLBACK
    assert r.items == first.items and r.scores == first.scores and r.model_version == "v1"
    assert ranked.served["degraded"] is True
    # no cached result for this user: the hot pool, minus what the request excludes
    r = (await rig.one(RankRequest("r3", "u2", exclude=("i39",)))).result
    assert r.reason == reasons.REDIS_UNAVAILABLE and not r.cached and r.model_version == ""
    assert list(r.items) == ["i38", "i01", "i37", "i36"]
    # two failed batches opened the breaker: Redis is not called, the cache still serves
    r = (await rig.one(RankRequest("r4", "u1"))).result
    assert r.reason == reasons.CACHED_FALLBACK and r.items == first.items
    # past the TTL the cached result is not served any more
    clock.now += SETTINGS.result_cache_ttl_s
    r = (await rig.one(RankRequest("r5", "u1"))).result
    assert r.reason == reasons.BREAKER_OPEN and not r.cached and list(r.items) == list(HOT[:4])
    assert rig.fallbacks("features", reasons.CACHED_FALLBACK) == 2
    assert rig.fallbacks("features", reasons.REDIS_UNAVAILABLE) == 1
    assert rig.fallbacks("features", reasons.BREAKER_OPEN) == 1


async def test_no_model_serves_the_hot_pool() -> None:
    rig = Rig(None)
    r = (await rig.one(RankRequest("r1", "u1", top_k=3))).result
    assert r.reason == reasons.NO_MODEL and list(r.items) == list(HOT[:3])
    assert rig.fallbacks("model", reasons.NO_MODEL) == 1


async def test_a_repeat_is_served_from_the_cache_until_a_new_click_or_version() -> None:
    found = retriever()
    rig = Rig(serving(found))
    first = (await rig.one(RankRequest("r1", "u1"))).result
    again = await rig.one(RankRequest("r2", "u1"))
    r = again.result
    assert r.cached and not r.degraded and r.reason is None
    assert r.items == first.items and r.scores == first.scores and r.model_version == "v1"
    assert found.searches == 1  # no stage ran
    assert not {"retrieval", "filter", "coarse", "rank", "rerank"} & set(r.timings_ms)
    assert again.served["cached"] is True and again.served["items"] == list(r.items)
    # another top_k or exclude is another result
    assert not (await rig.one(RankRequest("r3", "u1", top_k=3))).result.cached
    assert not (await rig.one(RankRequest("r4", "u1", exclude=("x",)))).result.cached
    # a new click: the sequence version changes
    rig.features.sequences["u1"].append(Event("i20", 4, "e4"))
    r = (await rig.one(RankRequest("r5", "u1"))).result
    assert not r.cached and found.searches == 4
    assert (await rig.one(RankRequest("r6", "u1"))).result.cached
    # a new version never gets the old version's result
    rig.state = serving(found, version="v2")
    r = (await rig.one(RankRequest("r7", "u1"))).result
    assert not r.cached and r.model_version == "v2"
    hits = rig.metrics.result_cache_hits._value.get()
    misses = rig.metrics.result_cache_misses._value.get()
    assert (hits, misses) == (2, 5)


async def test_a_request_as_of_an_earlier_time_is_a_different_sequence_version() -> None:
    rig = Rig(serving(retriever()))
    await rig.one(RankRequest("r1", "u1"))
    r = (await rig.one(RankRequest("r2", "u1", ts=3))).result  # before e3: another sequence
    assert not r.cached


async def test_a_mixed_batch_answers_both_kinds() -> None:
    rig = Rig(serving(retriever()))
    batch = [
        Incoming(RankRequest("r1", "u1", ("i10", "i11")), 10_000, 10_005),
        Incoming(RankRequest("r2", "u1"), 10_000, 10_005),
    ]
    own, found = await rig.service.rank(batch, deadlines=[FAR, FAR])
    np.testing.assert_allclose(own.result.scores, expected(HISTORY, ["i10", "i11"]), atol=1e-6)
    assert own.result.items == ("i10", "i11")
    assert list(found.result.items) == reference(retriever(), HISTORY)[0]
    assert rig.features.calls == 1  # one read for the batch (the model uses no counters)


async def test_an_expired_retrieval_request_is_answered_empty_and_not_logged() -> None:
    rig = Rig(serving(retriever()))
    ranked = await rig.one(RankRequest("r1", "u1"), deadline=1)
    assert ranked.result.reason == reasons.EXPIRED and ranked.result.items == ()
    assert ranked.served is None


class CountedFeatures(Features):
    """A store whose items have ``clicks_1h`` = their number (i07 -> 7); the second read (the
    candidates') fails when ``fail_second`` is set."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.reads: list[list[tuple[str, ...]]] = []
        self.fail_second = False

    async def read_batch(
        self, queries: Sequence[FeatureQuery], *, counters: bool, attributes: bool
    ) -> list[RequestFeatures]:
        self.reads.append([tuple(q.items) for q in queries])
        if self.fail_second and len(self.reads) == 2:
            raise ConnectionError("redis down")
        out = await super().read_batch(queries, counters=counters, attributes=attributes)
        return [
            RequestFeatures(read.user, [ItemFeatures(int(i[1:]), 0, None) for i in q.items])
            for read, q in zip(out, queries, strict=True)
        ]


class CountersScorer(MeanDotScorer):
    features = FeatureSpec(families=("sequence", "counters"))


async def test_a_version_with_counters_reads_the_survivors_features_once_more() -> None:
    features = CountedFeatures({k: list(v) for k, v in SEQ.items()}, {})
    rig = Rig(serving(retriever(), CountersScorer()), features=features)
    ranked = await rig.one(RankRequest("r1", "u1"))
    r = ranked.result
    assert not r.degraded and list(r.items) == reference(retriever(), HISTORY)[0]
    first, second = features.reads  # the batch's read, then one for every survivor
    assert first == [()] and len(second[0]) == SETTINGS.coarse
    counters = ranked.served["features"]["counters"]
    assert [row[2] for row in counters] == [int(i[1:]) for i in r.items]  # the shown items'


async def test_the_survivors_read_failing_skips_rank() -> None:
    features = CountedFeatures({k: list(v) for k, v in SEQ.items()}, {})
    features.fail_second = True
    rig = Rig(serving(retriever(), CountersScorer()), features=features)
    r = (await rig.one(RankRequest("r1", "u1"))).result
    assert r.reason == reasons.RANK_SKIPPED
    assert list(r.items) == reference(retriever(), HISTORY, rank=False)[0]
    assert rig.metrics.redis_errors._value.get() == 1
