"""What the scoring worker ranks with, wired from the settings: the feature reader, the cached
embedding store, the model loader, the retrievers' loader, the version watcher, the hot-item
pool, the result cache and the :class:`RankService`. Tests inject their own features,
embeddings, loaders and pool instead of the production ones."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from scoring.serving.breaker import CircuitBreaker
from scoring.serving.hotpool import HotPool
from scoring.serving.margin import DeadlineMargin
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.protocols import EmbeddingSource, FeatureSource, HotItems
from scoring.serving.result_cache import ResultCache
from scoring.serving.service import RankService
from scoring.serving.watcher import Loader, RecentIds, RetrieverLoader, VersionWatcher
from streamrank.redis.client import redis_client
from streamrank.runtime.memory import retain_freed_memory
from streamrank.settings import ScoringSettings, Settings

logger = logging.getLogger(__name__)
# Logged once per loaded version; `streamrank replay` reads it to report what served.
RUNTIME_LOG = "version %s serves its forward on the %s runtime"


@dataclass(frozen=True, slots=True)
class Dependencies:
    """What ranking reads: features, embeddings and the model loader (None: the real ones);
    each version's retriever (None: no retrieval index, the hot pool serves retrieval
    requests) and the hot-item pool (None: the worker's own)."""

    features: FeatureSource | None = None
    embeddings: EmbeddingSource | None = None
    loader: Loader | None = None
    retrievers: RetrieverLoader | None = None
    hot: HotItems | None = None


def configure_torch(scoring: ScoringSettings) -> None:
    """Torch and faiss thread pools and the allocator's thresholds from the settings (inter-op
    can only be set once per process)."""
    import faiss
    import torch

    retain_freed_memory(scoring.retain_freed_mb)
    torch.set_num_threads(scoring.torch_threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(scoring.torch_interop_threads)
    faiss.omp_set_num_threads(scoring.index_threads)


def scoring_redis(settings: Settings) -> aioredis.Redis:
    """The worker's Redis client. A request may wait for Redis up to its deadline (RankService
    bounds each wait), so the socket timeout must not cut it shorter than the default budget."""
    s = settings
    return redis_client(s.redis, timeout_s=max(s.redis.timeout_s, s.scoring.budget_ms / 1000))


def real_dependencies(
    settings: Settings, redis: aioredis.Redis, metrics: ScoringMetrics
) -> tuple[FeatureSource, EmbeddingSource, Loader]:
    """The production feature reader, cached embedding store and DIN scorer loader."""
    from scoring.embeddings.cache import CachedEmbeddings
    from scoring.embeddings.store import EmbeddingStore
    from scoring.model.features import check_servable
    from scoring.model.registry import load_scorer_from_redis
    from streams.reader import FeatureReader

    features = FeatureReader(redis=redis, features=settings.features)
    embeddings = CachedEmbeddings.from_settings(
        store=EmbeddingStore(redis=redis), embeddings=settings.embeddings, registry=metrics.registry
    )

    async def loader(version: str) -> Any:
        scorer, config = await load_scorer_from_redis(
            redis, version, dense=settings.scoring.dense_weights,
            runtime=settings.scoring.runtime, threads=settings.scoring.torch_threads,
        )  # fmt: skip
        check_servable(scorer.features, settings.features)  # refused: serving stays as it is
        metrics.model_encoding(version, str(config.get("encoding", "unknown")))
        metrics.model_runtime(version, scorer.runtime)
        logger.info(RUNTIME_LOG, version, scorer.runtime)
        return scorer

    return features, embeddings, loader


def real_retriever_loader(redis: aioredis.Redis) -> RetrieverLoader:
    """Loads a published version's retriever from Redis (None: the version has none)."""
    from scoring.model.registry import load_retriever_from_redis, published_config

    async def load(version: str) -> Any:
        return await load_retriever_from_redis(
            redis, version, await published_config(redis, version)
        )

    return load


def hot_pool(settings: Settings, redis: aioredis.Redis, metrics: ScoringMetrics) -> HotPool:
    """The hot-item pool (not started): ``cascade.hot_pool`` items of the ``cascade.hot_window``
    item window, re-read every ``cascade.hot_refresh_s``."""
    from streams.hot_items import HotItemsReader

    c = settings.cascade
    return HotPool(
        reader=HotItemsReader(redis=redis, features=settings.features),
        window=c.hot_window,
        size=c.hot_pool,
        refresh_s=c.hot_refresh_s,
        metrics=metrics,
    )


def rank_service(
    settings: Settings,
    redis: aioredis.Redis,
    metrics: ScoringMetrics,
    injected: Dependencies,
    *,
    hot: HotItems | None = None,
) -> tuple[VersionWatcher, RankService]:
    """The version watcher (not started) and the service that ranks with what it serves;
    ``hot``: the hot-item pool (``injected.hot`` wins; None: an empty one)."""
    s = settings
    features, embeddings, loader = injected.features, injected.embeddings, injected.loader
    retrievers = injected.retrievers
    if features is None or embeddings is None or loader is None:
        features, embeddings, loader = real_dependencies(s, redis, metrics)
        retrievers = retrievers or real_retriever_loader(redis)
    recent = RecentIds(s.embeddings.cache_warm_top_k)
    watcher = VersionWatcher(
        redis=redis,
        loader=loader,
        embeddings=embeddings,
        metrics=metrics,
        static_split=s.scoring.canary_split,
        recent=recent,
        warm_top_k=s.embeddings.cache_warm_top_k,
        poll_s=s.scoring.poll_s,
        retriever_loader=retrievers,
    )
    service = RankService(
        features=features,
        embeddings=embeddings,
        serving=lambda: watcher.current,
        breaker=CircuitBreaker(
            failures=s.scoring.breaker_failures, cooldown_s=s.scoring.breaker_cooldown_s
        ),
        metrics=metrics,
        sequence_length=s.features.sequence_length,
        forward_mode=s.scoring.forward,
        log_served=s.topics.served_log is not None,
        recent=recent,
        margin=DeadlineMargin(cap_ms=s.scoring.budget_ms / 2),
        hot=injected.hot if injected.hot is not None else hot,
        cascade=s.cascade,
        result_cache=ResultCache.from_settings(s.cascade, redis=redis, metrics=metrics),
    )
    return watcher, service
