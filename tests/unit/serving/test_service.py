"""RankService on in-memory stand-ins for its sources (pure logic: the real ones are covered by
the integration tests): scores reach the right requests, deadlines, degradation, the breaker."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from schemas import RankRequest, reasons
from scoring.model.canary import parse_split
from scoring.model.features import FeatureSpec
from scoring.serving.breaker import BreakerState, CircuitBreaker
from scoring.serving.features import ServedFeatures
from scoring.serving.margin import DeadlineMargin
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.served_log import served_record
from scoring.serving.service import Incoming, RankService
from scoring.serving.watcher import Serving
from streamrank import clock
from streamrank.errors import EmbeddingError
from streams.reader import FeatureQuery, ItemFeatures, RequestFeatures, UserFeatures

DIM = 4


def row_of(item_id: str, version: str = "") -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(f"{version}/{item_id}".encode()).digest()[:4], "big")
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


@dataclass(frozen=True)
class Event:
    item_id: str
    ts: int
    event_id: str
    action: str | None = None


class Features:
    def __init__(
        self, sequences: Mapping[str, list[Event]], popularity: Mapping[str, float]
    ) -> None:
        self.sequences, self.popularity = sequences, popularity
        self.fail_sequences = self.fail_popularity = False
        self.calls = 0

    async def get_sequences(self, user_ids: Sequence[str]) -> Mapping[str, Sequence[Any]]:
        self.calls += 1
        if self.fail_sequences:
            raise ConnectionError("redis down")
        return {u: self.sequences.get(u, []) for u in user_ids}

    async def read_batch(
        self, queries: Sequence[FeatureQuery], *, counters: bool, attributes: bool
    ) -> list[RequestFeatures]:
        """The store's batch read over :meth:`get_sequences`: events before each as-of time."""
        sequences = await self.get_sequences([q.user_id for q in queries])
        return [
            RequestFeatures(
                UserFeatures([e for e in sequences[q.user_id] if e.ts < q.as_of_ms], 0, 0, {}, {}),
                [ItemFeatures(0, 0, None) for _ in q.items],
            )
            for q in queries
        ]

    async def item_popularity(self, item_ids: Sequence[str]) -> np.ndarray:
        self.calls += 1
        if self.fail_popularity:
            raise ConnectionError("redis down")
        return np.array([self.popularity.get(i, 0.0) for i in item_ids])


class Embeddings:
    def __init__(self) -> None:
        self.lookups: list[tuple[str, list[str]]] = []

    async def lookup(self, version: str, table: str, ids: Sequence[str]) -> np.ndarray:
        self.lookups.append((version, list(ids)))
        return (
            np.stack([row_of(i, version) for i in ids]) if ids else np.zeros((0, DIM), np.float32)
        )

    async def warm(self, version: str, table: str, ids: Sequence[str]) -> None:
        return None

    def stats(self) -> Mapping[str, Any]:
        return {"hits": 1, "misses": 2}


class MeanDotScorer:
    """sigmoid(cand . masked-mean(history)); padding must not change it."""

    features = FeatureSpec()

    def score(
        self,
        hist: np.ndarray,
        hist_mask: np.ndarray,
        cands: np.ndarray,
        cand_mask: np.ndarray,
        side: Any = None,
    ) -> np.ndarray:
        m = hist_mask[..., None].astype(np.float32)
        mean = (hist * m).sum(1) / np.maximum(m.sum(1), 1.0)  # [B, d]
        logits = (cands * mean[:, None, :]).sum(-1) + 0.1  # [B, C]
        return 1.0 / (1.0 + np.exp(-logits))


def expected(history: list[str], items: Sequence[str], version: str = "v1") -> np.ndarray:
    hist = np.stack([row_of(i, version) for i in history]) if history else np.zeros((0, DIM))
    mean = hist.mean(0) if history else np.zeros(DIM)
    logits = np.stack([row_of(i, version) for i in items]) @ mean + 0.1
    return 1.0 / (1.0 + np.exp(-logits))


def make(
    serving: Serving | None, features: Features, **kw: Any
) -> tuple[RankService, CircuitBreaker]:
    breaker = CircuitBreaker(failures=2, cooldown_s=60.0)
    service = RankService(
        features=features,
        embeddings=Embeddings(),
        serving=lambda: serving,
        breaker=breaker,
        metrics=ScoringMetrics(),
        sequence_length=3,
        **kw,
    )
    return service, breaker


def incoming(rid: str, user: str, items: Sequence[str], ts: int | None = None) -> Incoming:
    return Incoming(RankRequest(rid, user, tuple(items), ts=ts), produced_ms=10_000,
                    received_ms=10_005)  # fmt: skip


FAR = 2**62
SEQ = {"u1": [Event(f"h{i}", i, f"e{i}") for i in range(5)], "u2": [Event("a", 1, "e9")]}
ONE = Serving(split=(("v1", 1.0),), scorers={"v1": MeanDotScorer()}, source="pointer")


@pytest.mark.parametrize("mode", ["batched", "per_request"])
async def test_scores_match_each_requests_own_history_and_items(mode: str) -> None:
    features = Features(SEQ, {})
    service, _ = make(ONE, features, forward_mode=mode, log_served=True)
    batch = [
        incoming("r1", "u1", ["a", "b", "zz"]),
        incoming("r2", "u2", ["b"]),
        incoming("r3", "cold", ["a", "c"]),
    ]
    out = await service.rank(batch, deadlines=[FAR] * 3)
    assert [r.result.request_id for r in out] == ["r1", "r2", "r3"]
    # u1 keeps only its newest 3 events (sequence_length=3)
    assert np.allclose(
        out[0].result.scores, expected(["h2", "h3", "h4"], ["a", "b", "zz"]), atol=1e-6
    )
    assert np.allclose(out[1].result.scores, expected(["a"], ["b"]), atol=1e-6)
    assert np.allclose(out[2].result.scores, expected([], ["a", "c"]), atol=1e-6)  # cold start
    assert all(not r.result.degraded and r.result.model_version == "v1" for r in out)
    assert set(out[0].result.timings_ms) == {
        "queue_wait",
        "sequence_fetch",
        "embedding_lookup",
        "forward",
        "total",
    }
    assert out[0].result.timings_ms["queue_wait"] == 5.0
    assert features.calls == 1  # one round trip for all sequences
    record = out[0].served
    assert record is not None and record["sequence"]["item_ids"] == ["h2", "h3", "h4"]
    assert record["sequence"]["event_ids"] == ["e2", "e3", "e4"] and record["scores"] == list(
        out[0].result.scores
    )


async def test_expired_requests_get_degraded_replies_without_compute() -> None:
    features = Features(SEQ, {})
    service, _ = make(ONE, features)
    out = await service.rank([incoming("r1", "u1", ["a", "b"])], deadlines=[1])
    assert out[0].result.degraded and out[0].result.reason == reasons.EXPIRED
    assert out[0].result.scores == (0.5, 0.5)
    assert features.calls == 0


async def test_redis_failure_falls_back_to_popularity_then_neutral_then_breaker() -> None:
    features = Features(SEQ, {"a": 100.0, "b": 1.0})
    service, breaker = make(ONE, features)
    features.fail_sequences = True
    out = await service.rank([incoming("r1", "u1", ["b", "a", "c"])], deadlines=[FAR])
    r = out[0].result
    assert r.degraded and r.reason == reasons.REDIS_UNAVAILABLE
    assert r.scores[1] > r.scores[0] > r.scores[2] == 0.0  # popularity order a > b > c
    features.fail_popularity = True
    out = await service.rank([incoming("r2", "u1", ["b", "a"])], deadlines=[FAR])
    assert out[0].result.scores == (0.5, 0.5) and out[0].result.reason == reasons.REDIS_UNAVAILABLE
    assert breaker.state is BreakerState.OPEN
    calls = features.calls
    out = await service.rank([incoming("r3", "u1", ["b"])], deadlines=[FAR])
    assert out[0].result.reason == reasons.BREAKER_OPEN and features.calls == calls  # no Redis call


async def test_no_active_model_gives_popularity_fallback() -> None:
    service, _ = make(None, Features(SEQ, {"a": 5.0}))
    out = await service.rank([incoming("r1", "u1", ["a", "b"])], deadlines=[FAR])
    assert (
        out[0].result.reason == reasons.NO_MODEL
        and out[0].result.scores[0] > out[0].result.scores[1]
    )


async def test_canary_groups_score_with_their_own_version() -> None:
    split = parse_split("v1:0.5,v2:0.5")
    serving = Serving(
        split=split, scorers={"v1": MeanDotScorer(), "v2": MeanDotScorer()}, source="split"
    )
    service, _ = make(serving, Features(SEQ, {}))
    users = [f"user{i}" for i in range(40)]
    out = await service.rank(
        [incoming(f"r{i}", u, ["a", "b"]) for i, u in enumerate(users)], deadlines=[FAR] * 40
    )
    versions = {r.result.model_version for r in out}
    assert versions == {"v1", "v2"}
    for r, version in zip(out, serving.assign(users), strict=True):
        assert r.result.model_version == version
        assert np.allclose(r.result.scores, expected([], ["a", "b"], version), atol=1e-6)


def test_served_record_shape_and_values() -> None:
    rec = served_record(
        RankRequest("r", "u", ("a",)), "v1", [Event("x", 5, "e1", "cart")], [0.25], 99,
        latency_ms=4.5, features=ServedFeatures(7, [3, 1], [[1, 2, 3, 4, 5]]),
    )  # fmt: skip
    assert rec == {
        "request_id": "r",
        "user_id": "u",
        "model_version": "v1",
        "sequence": {"item_ids": ["x"], "ts": [5], "event_ids": ["e1"], "actions": ["cart"]},
        "features": {"as_of": 7, "codes": [3, 1], "counters": [[1, 2, 3, 4, 5]]},
        "items": ["a"],
        "scores": [0.25],
        "served_at": 99,
        "degraded": False,
        "latency_ms": 4.5,
    }


async def test_degraded_replies_are_logged_for_the_version_they_were_routed_to() -> None:
    """The outcomes worker counts a version's degraded share from these records."""
    split = parse_split("v1:0.5,v2:0.5")
    serving = Serving(
        split=split, scorers={"v1": MeanDotScorer(), "v2": MeanDotScorer()}, source="split"
    )
    features = Features(SEQ, {"a": 2.0})
    features.fail_sequences = True
    service, _ = make(serving, features, log_served=True)
    users = [f"user{i}" for i in range(12)]
    batch = [incoming(f"r{i}", u, ["a", "b"]) for i, u in enumerate(users)]
    out = await service.rank(batch, deadlines=[FAR] * 6 + [0] * 6)  # the last six expired
    for ranked, version in zip(out, serving.assign(users), strict=True):
        assert ranked.result.degraded and ranked.served is not None
        assert ranked.served["degraded"] is True and ranked.served["model_version"] == version
        assert ranked.served["reason"] == ranked.result.reason
        assert ranked.served["scores"] == list(ranked.result.scores)
        assert "sequence" not in ranked.served
    assert {r.result.reason for r in out} == {reasons.REDIS_UNAVAILABLE, reasons.EXPIRED}
    assert out[0].served is not None and out[0].served["latency_ms"] is not None
    # no model at all: nothing is routed, nothing logged
    service, _ = make(None, Features(SEQ, {}), log_served=True)
    out = await service.rank([incoming("r1", "u1", ["a"])], deadlines=[FAR])
    assert out[0].result.degraded and out[0].served is None


class BrokenEmbeddings(Embeddings):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error: Exception | None = error

    async def lookup(self, version: str, table: str, ids: Sequence[str]) -> np.ndarray:
        if self.error is not None:
            raise self.error
        return await super().lookup(version, table, ids)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (EmbeddingError("table missing"), reasons.MODEL_UNAVAILABLE),
        (RuntimeError("shape mismatch"), reasons.INTERNAL_ERROR),
    ],
)
async def test_model_failure_during_half_open_probe_does_not_wedge_the_breaker(
    error: Exception, reason: str
) -> None:
    """A probe whose Redis calls succeed but whose model fails must end the probe (the breaker
    used to stay half-open with the probe taken, refusing Redis forever); an unexpected error
    gives a degraded reply instead of crashing the worker."""
    features = Features(SEQ, {"a": 3.0})
    embeddings = BrokenEmbeddings(error)
    breaker = CircuitBreaker(failures=1, cooldown_s=0.0)
    service = RankService(
        features=features,
        embeddings=embeddings,
        serving=lambda: ONE,
        breaker=breaker,
        metrics=ScoringMetrics(),
        sequence_length=3,
    )
    breaker.record_failure()  # open; cool-down 0 -> the next call is the half-open probe
    out = await service.rank([incoming("r1", "u1", ["b", "a"])], deadlines=[FAR])
    assert out[0].result.degraded and out[0].result.reason == reason
    assert out[0].result.scores[1] > out[0].result.scores[0]  # popularity a > b
    assert breaker.state is BreakerState.CLOSED
    embeddings.error = None
    out = await service.rank([incoming("r2", "u1", ["a", "b"])], deadlines=[FAR])
    r = out[0].result
    assert not r.degraded and r.reason is None and r.model_version == "v1"
    hist = [e.item_id for e in SEQ["u1"]][-3:]
    np.testing.assert_allclose(r.scores, expected(hist, ["a", "b"]), rtol=1e-5)


async def test_the_history_is_cut_at_the_request_time_else_at_the_record_time() -> None:
    service, _ = make(ONE, Features(SEQ, {}), log_served=True)
    out = await service.rank(
        [incoming("r1", "u1", ["a", "b"], ts=3), incoming("r2", "u1", ["a", "b"])],
        deadlines=[FAR, FAR],
    )
    # ts=3: events at 0, 1, 2 are known, 3 and 4 are not; without ts, the record's time
    np.testing.assert_allclose(out[0].result.scores, expected(["h0", "h1", "h2"], ["a", "b"]),
                               rtol=1e-5)  # fmt: skip
    np.testing.assert_allclose(out[1].result.scores, expected(["h2", "h3", "h4"], ["a", "b"]),
                               rtol=1e-5)  # fmt: skip
    assert out[0].served is not None and out[0].served["features"] == {"as_of": 3}
    assert out[0].served["sequence"]["event_ids"] == ["e0", "e1", "e2"]


class HangingFeatures(Features):
    """A Redis that accepts the call and never answers (paused, stalled network)."""

    async def get_sequences(self, user_ids: Sequence[str]) -> Mapping[str, Sequence[Any]]:
        self.calls += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_hanging_redis_costs_at_most_the_batch_deadline() -> None:
    """Replies are degraded at the earliest deadline of the batch, not after a socket timeout
    (or never). A deadline that passed is no evidence that Redis is down: the breaker stays
    closed (a pause may end within the next batch's budget)."""
    features = HangingFeatures(SEQ, {"a": 1.0})
    service, breaker = make(ONE, features)
    now = clock.now_ms()
    started = time.monotonic()
    out = await service.rank(
        [incoming("r1", "u1", ["a", "b"]), incoming("r2", "u2", ["b"])],
        deadlines=[now + 150, now + 60_000],
    )
    waited = time.monotonic() - started
    assert 0.1 <= waited < 30  # the earliest deadline (150 ms), not a hang
    assert [r.result.reason for r in out] == [reasons.REDIS_UNAVAILABLE] * 2
    assert all(r.result.degraded and len(r.result.scores) == len(r.result.items) for r in out)
    assert breaker.state is BreakerState.CLOSED and breaker._failures == 0


async def test_redis_back_within_the_deadline_costs_only_latency() -> None:
    class SlowFeatures(Features):
        async def get_sequences(self, user_ids: Sequence[str]) -> Mapping[str, Sequence[Any]]:
            await asyncio.sleep(0.1)
            return await super().get_sequences(user_ids)

    service, _ = make(ONE, SlowFeatures(SEQ, {}))
    out = await service.rank([incoming("r1", "u1", ["a"])], deadlines=[clock.now_ms() + 5000])
    assert not out[0].result.degraded and out[0].result.model_version == "v1"


async def test_a_half_open_probe_cut_by_the_deadline_does_not_wedge_the_breaker() -> None:
    """Regression (seen in the failover scenario): the probe batch hit its deadline while Redis
    was still paused; the probe was never ended, and the breaker refused Redis for good."""
    hanging = HangingFeatures(SEQ, {})
    service, breaker = make(ONE, hanging)
    breaker.record_failure()
    breaker.record_failure()  # open (failures=2)
    breaker._opened_at -= 60.0  # the cooldown has passed: the next batch probes
    out = await service.rank([incoming("r1", "u1", ["a"])], deadlines=[clock.now_ms() + 50])
    assert out[0].result.reason == reasons.REDIS_UNAVAILABLE
    # Redis is back: the next batch probes again and closes the breaker.
    service._features = Features(SEQ, {})
    out = await service.rank([incoming("r2", "u1", ["a"])], deadlines=[FAR])
    assert not out[0].result.degraded
    assert breaker.state is BreakerState.CLOSED


class TimedFeatures(Features):
    """A Redis that answers every sequence fetch after ``delay_s``."""

    delay_s = 0.02

    async def get_sequences(self, user_ids: Sequence[str]) -> Mapping[str, Sequence[Any]]:
        await asyncio.sleep(self.delay_s)
        return await super().get_sequences(user_ids)


async def test_a_request_about_to_expire_does_not_cut_its_whole_batch_short() -> None:
    """After a failover a batch of backlog mixes requests a millisecond from their deadline with
    requests that have seconds left: the first are answered expired at once, the rest scored."""
    features = TimedFeatures(SEQ, {})
    service, breaker = make(ONE, features, margin=DeadlineMargin(cap_ms=1000.0))
    warm = await service.rank([incoming("r0", "u1", ["a"])], deadlines=[FAR])
    assert not warm[0].result.degraded  # Redis answered once: its time is known (~20 ms)
    now = clock.now_ms()
    out = await service.rank(
        [incoming("r1", "u1", ["a", "b"]), incoming("r2", "u2", ["b"])],
        deadlines=[now + 5, now + 10_000],
    )
    assert [(r.result.degraded, r.result.reason) for r in out] == [
        (True, reasons.EXPIRED),
        (False, None),
    ]
    assert out[1].result.model_version == "v1"
    assert breaker.state is BreakerState.CLOSED


async def test_without_the_margin_the_same_batch_is_cut_at_its_earliest_deadline() -> None:
    """What the margin prevents (and what a cold worker, which knows no Redis time yet, does)."""
    features = TimedFeatures(SEQ, {})
    service, _ = make(ONE, features)  # no margin
    now = clock.now_ms()
    out = await service.rank(
        [incoming("r1", "u1", ["a", "b"]), incoming("r2", "u2", ["b"])],
        deadlines=[now + 5, now + 10_000],
    )
    assert [r.result.reason for r in out] == [reasons.REDIS_UNAVAILABLE] * 2


async def test_no_deadline_cuts_the_batch_wait_below_the_minimum_even_on_a_cold_worker() -> None:
    """The margin's guess of Redis' time can be short (a survivor's first batches after a
    takeover): a request with a few ms left bounds its batch's Redis wait only down to
    ``min_wait_ms``, so Redis answering in 20 ms scores both (the first one late)."""
    features = TimedFeatures(SEQ, {})
    service, breaker = make(ONE, features, margin=DeadlineMargin(cap_ms=1000.0))  # cold
    now = clock.now_ms()
    out = await service.rank(
        [incoming("r1", "u1", ["a", "b"]), incoming("r2", "u2", ["b"])],
        deadlines=[now + 5, now + 10_000],
    )
    assert [(r.result.degraded, r.result.model_version) for r in out] == [(False, "v1")] * 2
    assert breaker.state is BreakerState.CLOSED


async def test_a_hanging_redis_is_still_cut_at_the_minimum_wait() -> None:
    features = HangingFeatures(SEQ, {"a": 1.0})
    service, _ = make(ONE, features, margin=DeadlineMargin(cap_ms=200.0))
    now = clock.now_ms()
    started = time.monotonic()
    out = await service.rank([incoming("r1", "u1", ["a"])], deadlines=[now + 5])
    assert 0.15 <= time.monotonic() - started < 5  # ~200 ms: the minimum wait, then cut
    assert out[0].result.reason == reasons.REDIS_UNAVAILABLE


def test_the_margin_follows_redis_time_up_to_its_cap() -> None:
    margin = DeadlineMargin(cap_ms=25.0)
    assert margin.ms == 0.0  # nothing known: nothing refused
    margin.observe(4.0)
    assert margin.ms == 8.0  # twice the first observation
    for _ in range(200):
        margin.observe(2.0)
    assert margin.ms == pytest.approx(4.0, abs=0.01)  # the average moved to the new time
    for _ in range(200):
        margin.observe(100.0)  # a slow Redis
    assert margin.ms == 25.0  # capped: a slow Redis does not expire every request
