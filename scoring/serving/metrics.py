"""Every metric of the scoring worker, built in one place from an injected registry.

The embedding cache registers its own ``streamrank_embedding_cache_*`` metrics in the same
registry (``scoring.embeddings.metrics``); the hot-item pool's are ``streamrank_hot_pool_*``.

Latency buckets suit a tens-of-milliseconds budget: fine steps from 1 ms to 50 ms, then a few
coarse ones to see outliers (Redis timeouts, GC pauses, broker stalls).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from streamrank.runtime.group_metrics import GroupMetrics, Wording

LATENCY_BUCKETS = (
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025,
    0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CASCADE_STAGES = ("retrieval", "filter", "coarse", "rank", "rerank")
STAGES = ("queue_wait", "sequence_fetch", "embedding_lookup", "forward", *CASCADE_STAGES, "total")


WORDING = Wording(
    items="Requests",
    after="the last answered batch",
    committed="answered requests",
    topic="the request topic",
)


class ScoringMetrics(GroupMetrics):
    """Counters, histograms and gauges of one scoring worker (the consumer-group family from
    :class:`GroupMetrics`, prefix ``streamrank_scoring``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry, prefix="streamrank_scoring", wording=WORDING)
        r = self.registry
        self.requests = Counter(
            "streamrank_scoring_requests",
            "Rank requests answered, by outcome (ok, degraded, error), reason and the topic the "
            "reply went to.",
            ["outcome", "reason", "topic"],
            registry=r,
        )
        self.fetch_wait = Gauge(
            "streamrank_scoring_fetch_wait_seconds",
            "The wait the request consumer asks the broker to hold a fetch: scoring_fetch_wait_ms, "
            "raised while the broker answers fetches empty although requests wait.",
            registry=r,
        )
        self.latency = Histogram(
            "streamrank_scoring_request_latency_seconds",
            "End to end: request produced -> reply acknowledged by the broker.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_latency = Histogram(
            "streamrank_scoring_stage_seconds",
            "Time per stage of a request: queue_wait, sequence_fetch, embedding_lookup, forward, "
            "the cascade's retrieval, filter, coarse, rank and rerank, total.",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "streamrank_scoring_batch_size",
            "Requests per micro-batch.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.redis_errors = Counter(
            "streamrank_scoring_redis_errors", "Redis calls that failed or timed out.", registry=r
        )
        self.breaker_state = Gauge(
            "streamrank_scoring_breaker_state",
            "Redis circuit breaker: 0 closed, 1 half-open, 2 open.",
            registry=r,
        )
        self.dead_letters = Counter(
            "streamrank_scoring_dead_letters",
            "Requests sent to the dead-letter topic, by reason.",
            ["reason"],
            registry=r,
        )
        self.skipped_requests = Counter(
            "streamrank_scoring_skipped_requests",
            "Offsets of request batches that could not be decoded and were skipped (each such "
            "batch is one dead letter with reason undecodable_batch naming the offsets).",
            registry=r,
        )
        self.model_active = Gauge(
            "streamrank_scoring_model_traffic_share",
            "Share of traffic each serving model version receives (1 = the only active one).",
            ["version"],
            registry=r,
        )
        self.version_switches = Counter(
            "streamrank_scoring_version_switches", "Serving version changes applied.", registry=r
        )
        self.model_info = Gauge(
            "streamrank_scoring_model_info",
            "1 for each model version this worker serves, with its item table's encoding and "
            "the runtime of its forward.",
            ["version", "encoding", "runtime"],
            registry=r,
        )
        self.model_loaded = Gauge(
            "streamrank_scoring_model_loaded",
            "1 once a model version is loaded and serving, 0 before (replies are degraded "
            "no_model meanwhile).",
            registry=r,
        )
        self.retrieval_unavailable = Counter(
            "streamrank_scoring_retrieval_unavailable",
            "Model versions loaded without a retriever, by reason (absent: trained without one; "
            "load_failed: a chunk missing or corrupt, or files that disagree); their requests "
            "without items get the hot-item pool.",
            ["reason"],
            registry=r,
        )
        self.cascade_fallbacks = Counter(
            "streamrank_cascade_fallbacks",
            "Retrieval requests answered by a fallback rung, by the stage that fell back "
            "(retrieval, rank, features: the Redis read, model) and the reply's reason.",
            ["stage", "reason"],
            registry=r,
        )
        self.result_cache_hits = Counter(
            "streamrank_cascade_result_cache_hits",
            "Retrieval requests answered from the result cache (same user, scene, version and "
            "sequence version, within the TTL).",
            registry=r,
        )
        self.result_cache_misses = Counter(
            "streamrank_cascade_result_cache_misses",
            "Retrieval requests the result cache could not answer.",
            registry=r,
        )
        self.result_cache_entries = Gauge(
            "streamrank_cascade_result_cache_entries",
            "Results held in this worker's local result cache.",
            registry=r,
        )
        self.hot_pool_failures = Counter(
            "streamrank_hot_pool_refresh_failures",
            "Hot-item pool refreshes that failed (the pool kept its last snapshot).",
            registry=r,
        )
        self.hot_pool_items = Gauge(
            "streamrank_hot_pool_items", "Items in the hot-item pool's snapshot.", registry=r
        )
        self.hot_pool_age = Gauge(
            "streamrank_hot_pool_age_seconds",
            "Seconds since the hot-item pool's snapshot was read (since the worker started, "
            "while it has none).",
            registry=r,
        )
        self.hot_pool_refresh = Histogram(
            "streamrank_hot_pool_refresh_seconds",
            "One successful hot-item pool refresh (one Redis round trip and the summing).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.cold_start_items = Counter(
            "streamrank_scoring_cold_start_items",
            "Items unknown to the serving version's item table scored with a cold-start vector "
            "built from their attributes (counted once per lookup), not the OOV row.",
            registry=r,
        )
        self._versions: set[str] = set()
        self._encodings: dict[str, str] = {}
        self._runtimes: dict[str, str] = {}
        # labelled children looked up once: labels() per reply and stage shows in the profile
        self._stages = {stage: self.stage_latency.labels(stage) for stage in STAGES}
        self._outcomes: dict[tuple[str, str | None, str], Any] = {}

    def observe_reply(
        self, *, degraded: bool, reason: str | None, error: bool, topic: str = ""
    ) -> None:
        outcome = "error" if error else "degraded" if degraded else "ok"
        child = self._outcomes.get((outcome, reason, topic))
        if child is None:
            code = (reason or "").split(":", 1)[0]
            child = self.requests.labels(outcome, code, topic)
            if len(self._outcomes) < 1024:  # reasons may carry details: keep the memo bounded
                self._outcomes[(outcome, reason, topic)] = child
        child.inc()

    def fallback(self, stage: str, reason: str, n: int = 1) -> None:
        """``n`` retrieval requests fell back at ``stage`` with ``reason``."""
        if n:
            self.cascade_fallbacks.labels(stage, reason).inc(n)

    def model_encoding(self, version: str, encoding: str) -> None:
        """The encoding of a loaded version's item table (for ``model_info``)."""
        self._encodings[version] = encoding

    def model_runtime(self, version: str, runtime: str) -> None:
        """The runtime serving a loaded version's forward (for ``model_info``)."""
        self._runtimes[version] = runtime

    def observe_stages(self, timings_ms: Mapping[str, float]) -> None:
        stages = self._stages
        for stage, value in timings_ms.items():
            child = stages.get(stage)
            if child is not None:
                child.observe(value / 1000.0)

    def set_split(self, split: tuple[tuple[str, float], ...]) -> None:
        self.model_info.clear()
        for version in self._versions - {v for v, _ in split}:
            self.model_active.remove(version)
        for version, weight in split:
            self.model_active.labels(version).set(weight)
            encoding = self._encodings.get(version, "unknown")
            runtime = self._runtimes.get(version, "unknown")
            self.model_info.labels(version, encoding, runtime).set(1)
        self._versions = {v for v, _ in split}
        self.model_loaded.set(1 if split else 0)
