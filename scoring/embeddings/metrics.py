"""Every Prometheus metric of the embedding cache and the overlay upserts, built in one place
from an injected registry."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from streamrank.runtime.group_metrics import GroupMetrics, Wording

# Fetch latency buckets (seconds): a loopback round trip is ~0.1-0.5 ms, a remote one a few ms.
FETCH_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
)


@dataclass(frozen=True, slots=True)
class EmbeddingCacheMetrics:
    hits: Counter
    misses: Counter
    evictions: Counter
    oov: Counter
    hit_ratio: Gauge
    bytes_used: Gauge
    entries: Gauge
    fetch_seconds: Histogram
    fetch_rows: Histogram
    overlay_rows: Counter

    @classmethod
    def build(cls, registry: CollectorRegistry | None = None) -> EmbeddingCacheMetrics:
        """All metrics on ``registry`` (a fresh private one when None, e.g. in tests)."""
        reg = registry if registry is not None else CollectorRegistry()
        return cls(
            hits=Counter(
                "streamrank_embedding_cache_hits",
                "Distinct ids per lookup found in the local cache.",
                registry=reg,
            ),
            misses=Counter(
                "streamrank_embedding_cache_misses",
                "Distinct ids per lookup fetched from Redis.",
                registry=reg,
            ),
            evictions=Counter(
                "streamrank_embedding_cache_evictions",
                "Entries dropped from the cache (including candidates refused admission).",
                registry=reg,
            ),
            oov=Counter(
                "streamrank_embedding_oov",
                "Distinct ids per lookup unknown to the table (served its OOV row).",
                registry=reg,
            ),
            hit_ratio=Gauge(
                "streamrank_embedding_cache_hit_ratio",
                "hits / (hits + misses) since the cache started.",
                registry=reg,
            ),
            bytes_used=Gauge(
                "streamrank_embedding_cache_bytes",
                "Bytes the cache accounts for (rows plus per-entry overhead).",
                registry=reg,
            ),
            entries=Gauge(
                "streamrank_embedding_cache_entries", "Rows held in the cache.", registry=reg
            ),
            fetch_seconds=Histogram(
                "streamrank_embedding_fetch_seconds",
                "Latency of one Redis round trip fetching a batch of cache misses.",
                buckets=FETCH_BUCKETS,
                registry=reg,
            ),
            fetch_rows=Histogram(
                "streamrank_embedding_fetch_rows",
                "Rows requested per Redis round trip.",
                buckets=(1, 5, 10, 25, 50, 100, 150, 250, 500, 1000),
                registry=reg,
            ),
            overlay_rows=Counter(
                "streamrank_embedding_overlay_rows",
                "Rows fetched from Redis that came from a table's overlay (upserted rows).",
                registry=reg,
            ),
        )


class OverlayMetrics(GroupMetrics):
    """The metrics of ``streamrank embeddings upsert --topic``: the group family plus upserts."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(
            registry,
            prefix="streamrank_overlay",
            wording=Wording(
                items="Rows",
                after="the last upserted batch",
                committed="upserted rows",
                topic="the rows topic",
            ),
        )
        r = self.registry
        self.upserts = Counter(
            "streamrank_embedding_overlay_upserts",
            "Upserts applied to a table's overlay (one per file or consumed batch).",
            registry=r,
        )
        self.upserted_rows = Counter(
            "streamrank_embedding_overlay_upserted_rows",
            "Rows written into a table's overlay.",
            registry=r,
        )
        self.dead_letters = Counter(
            "streamrank_overlay_dead_letters",
            "Rows refused and sent to the dead-letter topic, by reason.",
            ["reason"],
            registry=r,
        )
        self.redis_errors = Counter(
            "streamrank_overlay_redis_errors",
            "Upserts that met a Redis outage (retried with back-off).",
            registry=r,
        )
