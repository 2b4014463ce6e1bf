"""The stages' settings: features, embeddings, scoring and online outcomes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field

from streamrank.settings.base import CsvTuple, Section


class FeatureSettings(Section):
    """The features stage: user sequences, windowed counters, and the features worker."""

    env_prefix = "STREAMRANK_FEATURES_"
    env_names: ClassVar[Mapping[str, str]] = {
        "sequence_length": "STREAMRANK_SEQUENCE_LENGTH",
        "sequence_ttl_s": "STREAMRANK_SEQUENCE_TTL_S",
        "counter_bucket_s": "STREAMRANK_COUNTER_BUCKET_S",
        "counter_lateness_s": "STREAMRANK_COUNTER_LATENESS_S",
        "dedupe_ttl_s": "STREAMRANK_DEDUPE_TTL_S",
        "counter_coarse_bucket_s": "STREAMRANK_COUNTER_COARSE_BUCKET_S",
    }

    sequence_length: int = Field(50, ge=1, description="Events kept per user sequence.")
    sequence_ttl_s: int = Field(
        30 * 24 * 3600, ge=1, description="Idle time after which a sequence expires."
    )
    counter_bucket_s: int = Field(300, ge=1, description="Fine bucket size for the 1 h windows.")
    counter_lateness_s: int = Field(600, ge=0, description="Allowed lateness of event time.")
    dedupe_ttl_s: int = Field(48 * 3600, ge=1, description="How long an event_id is remembered.")
    batch_size: int = Field(2000, ge=1, description="Max clicks per feature-worker batch.")
    batch_within_s: float = Field(0.05, gt=0, description="Max wait to fill a click batch.")
    counter_coarse_bucket_s: int = Field(
        3600, ge=1, description="Coarse bucket size for the 24 h windows (and category counts)."
    )
    app_id: str = Field(
        "streamrank-features", description="Faust app id = the features consumer group id."
    )
    path: Literal["batch", "agent"] = Field(
        "batch",
        description="How the Faust worker hands clicks over: 'batch' drains whole fetches from "
        "Faust's consumer into the batch writer; 'agent' uses a Faust agent stream (slower).",
    )
    retry_max_s: float = Field(
        2.0, gt=0, description="Longest back-off between retries while Redis/Kafka is down."
    )
    fetch_max_wait_ms: int = Field(
        10,
        ge=0,
        description="Longest time the broker may hold a features fetch waiting for data (Faust "
        "hard-codes 1500 ms, which would add up to that much click-to-visible latency).",
    )
    redis_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Socket timeout of the features worker's batch writes (a 2,000-event script "
        "can outlast redis_timeout_s on a loaded host; a timed-out batch is retried).",
    )
    max_inflight_batches: int = Field(
        2,
        ge=1,
        description="Batches the features worker has in flight at once (batch path): the next "
        "fetch is decoded while Redis applies the previous one; 1 = strictly one at a time.",
    )
    commit_interval_s: float = Field(
        0.5, gt=0, description="How often the features worker commits acked offsets."
    )
    write_contract: Literal["id_sets", "markers"] = Field(
        "id_sets",
        description="How the features worker's batch script makes replays and duplicate "
        "event ids harmless: 'id_sets' (one event-id set per slot group and dedupe generation, "
        "counter increments summed per batch in the worker) or 'markers' (the previous "
        "contract: a SET NX marker per event and side, summed in Lua); docs/streams-idempotence.md.",
    )
    item_cache_s: float = Field(
        1.0,
        ge=0,
        description="How long a scoring worker reuses a candidate's counters and attributes "
        "read for the same window (a hot item is read once per this per process; a late click "
        "shows up to this much later); 0 = read every batch.",
    )


class EmbeddingSettings(Section):
    """The embedding store in Redis and the scoring worker's hot-row cache."""

    env_prefix = "STREAMRANK_EMBEDDING_"
    env_names: ClassVar[Mapping[str, str]] = {
        "cache_bytes": "STREAMRANK_CACHE_BYTES",
        "cache_policy": "STREAMRANK_CACHE_POLICY",
        "cache_warm_top_k": "STREAMRANK_CACHE_WARM_TOP_K",
        "cache_hold": "STREAMRANK_CACHE_HOLD",
    }

    encoding: Literal["fp32", "fp16", "int8"] = Field(
        "int8", description="Default row encoding for publish."
    )
    cache_bytes: int = Field(64 * 1024 * 1024, ge=0, description="Local hot-row cache budget.")
    cache_policy: Literal["tinylfu", "lru"] = Field("tinylfu", description="Hot-row cache policy.")
    cache_warm_top_k: int = Field(
        10_000, ge=0, description="Rows preloaded when a version activates."
    )
    cache_hold: Literal["encoded", "decoded"] = Field(
        "encoded",
        description="Whether the cache holds rows as fetched (encoded) or decoded to float32.",
    )
    configure_redis: bool = Field(
        True,
        description="Let the embedding store CONFIG SET hash-max-ziplist-value when rows are "
        "longer than the server's limit (else publish refuses with instructions).",
    )
    fetch_mode: Literal["script", "pipeline"] = Field(
        "script",
        description="One Lua call per batch of misses (per slot on a cluster), or a pipeline "
        "of HMGET per bucket.",
    )
    shards: int = Field(
        16,
        ge=1,
        description="Hash tags a published embedding table's buckets are grouped into: on a "
        "cluster, up to this many slots (and masters) hold one table, and a fetch makes up to "
        "this many script calls. Kept per table in its meta; applies to new publishes.",
    )
    overlay_check_ms: float = Field(
        1000.0,
        ge=0,
        description="How often (at most) the hot-row cache re-reads a table's overlay id when a "
        "batch is served from the cache alone: an upsert is served within this long (a batch "
        "with misses learns it from the fetch at once).",
    )
    overlay_group_id: str = Field(
        "streamrank-embeddings-upsert",
        description="Consumer group of `streamrank embeddings upsert --topic`.",
    )


class ScoringSettings(Section):
    """The scoring worker: micro-batches, deadlines, torch threads, breaker and canary."""

    env_prefix = "STREAMRANK_SCORING_"
    env_names: ClassVar[Mapping[str, str]] = {
        "torch_threads": "STREAMRANK_TORCH_THREADS",
        "torch_interop_threads": "STREAMRANK_TORCH_INTEROP_THREADS",
        "breaker_failures": "STREAMRANK_BREAKER_FAILURES",
        "breaker_cooldown_s": "STREAMRANK_BREAKER_COOLDOWN_S",
        "canary_split": "STREAMRANK_CANARY_SPLIT",
    }

    batch_max: int = Field(32, ge=1, description="Max requests per micro-batch.")
    batch_wait_ms: float = Field(
        0.0,
        ge=0,
        description="Max wait to fill a micro-batch once a request is in (0: take what has "
        "arrived; at saturation batches fill anyway).",
    )
    budget_ms: int = Field(50, ge=1, description="Default deadline when a request has none.")
    torch_threads: int = Field(
        1,
        ge=1,
        description="torch intra-op threads per process. Keep 1 and scale with worker "
        "processes, at most one per core left free by Redis, the broker and the rest of the host: "
        "the forward's ops are too small to gain from a second thread, which only costs hand-overs "
        "(docs/benchmarks-model.md).",
    )
    torch_interop_threads: int = Field(
        1,
        ge=1,
        description="torch inter-op threads per process; 1 (the DIN forward is one chain of ops).",
    )
    dense_weights: Literal["fp32", "int8"] = Field(
        "fp32",
        description="How the scoring worker serves the DIN's dense weights: fp32 (as trained) or "
        "int8 (torch dynamic quantisation of the attention unit's Linear layers; the head stays "
        "fp32). int8 keeps the AUC but is slower for one request at these layer sizes, so fp32 "
        "is the default (docs/benchmarks-model.md). `streamrank replay` scores offline "
        "with the same option.",
    )
    runtime: Literal["compiled", "eager", "onnx"] = Field(
        "compiled",
        description="What runs the DIN forward (fp32 dense weights): compiled (torch.compile's "
        "inductor, fused C++ kernels; needs a C++ compiler at run time and compiles each "
        "architecture before the version takes traffic), eager (torch op by op) or onnx (ONNX "
        "Runtime on the graph exported at publish; needs streamrank[onnx]). All three score "
        "within 1e-5 of eager, checked when a version loads; one that cannot run falls back to "
        "eager with an error logged (docs/runtimes.md).",
    )
    retain_freed_mb: int = Field(
        256,
        ge=0,
        description="Freed memory glibc keeps for reuse instead of handing it back to the kernel "
        "(M_TRIM_THRESHOLD; allocations up to a quarter of it stay on the heap): without it every "
        "forward's MB-sized intermediates are mapped and faulted in again. 0: glibc's defaults.",
    )
    breaker_failures: int = Field(
        3, ge=1, description="Redis failures in a row that open the breaker."
    )
    breaker_cooldown_s: float = Field(
        0.5,
        gt=0,
        description="Open-breaker pause before a probe (one batch tries Redis again): how soon "
        "replies are normal again once Redis is back.",
    )
    canary_split: str | None = Field(
        None, description="e.g. 'din-a:0.9,din-b:0.1'; None = pointer."
    )
    group_id: str = Field("streamrank-scoring", description="Consumer group of scoring workers.")
    forward: Literal["batched", "per_request"] = Field(
        "per_request",
        description="One DIN forward per micro-batch (padded across requests) or one per request.",
    )
    fetch_wait_ms: int = Field(
        2,
        ge=0,
        description="Longest a broker may hold a fetch of the scoring worker or RankClient "
        "(the embedded Tansu broker always holds it this long: it bounds the latency per hop); "
        "raised while the broker answers fetches empty although records wait.",
    )
    pipeline_depth: int = Field(
        2,
        ge=1,
        description="Micro-batches in flight in a scoring worker: one batch's compute overlaps "
        "the other's Redis and broker round trips; offsets still commit in order.",
    )
    commit_interval_ms: int = Field(
        100,
        ge=0,
        description="Scoring workers commit answered offsets at most this often (0: after "
        "every batch); a crash in between only repeats replies, it never loses a request.",
    )
    poll_s: float = Field(
        1.0, gt=0, description="How often the scoring worker polls the model version pointers."
    )
    index_threads: int = Field(
        1,
        ge=1,
        description="OpenMP threads of the retrieval index's searches (faiss) per scoring "
        "worker; 1, as the worker scores one batch at a time and scales with processes.",
    )


class OutcomeSettings(Section):
    """The outcomes worker: click attribution and per-version online statistics."""

    env_prefix = "STREAMRANK_OUTCOMES_"
    env_names: ClassVar[Mapping[str, str]] = {
        "window_s": "STREAMRANK_OUTCOME_WINDOW_S",
        "close_delay_s": "STREAMRANK_OUTCOME_CLOSE_DELAY_S",
        "bucket_s": "STREAMRANK_OUTCOME_BUCKET_S",
        "retention_s": "STREAMRANK_OUTCOME_RETENTION_S",
        "actions": "STREAMRANK_OUTCOME_ACTIONS",
    }

    group_id: str = Field(
        "streamrank-outcomes",
        description="Consumer group of outcomes workers (they read the served log and the clicks).",
    )
    window_s: int = Field(
        1800,
        ge=1,
        description="Attribution window: a click on a ranked item at most this long after the "
        "request was served counts for that request (the latest such request: last touch).",
    )
    close_delay_s: int = Field(
        60,
        ge=0,
        description="How long after its window ends a served record stays open for clicks that "
        "are processed late (consumer lag); then its outcome is final.",
    )
    bucket_s: int = Field(
        60,
        ge=1,
        description="Time bucket of the per-version online statistics in Redis: the resolution of "
        "rolling windows and rollout steps.",
    )
    retention_s: int = Field(
        24 * 3600, ge=60, description="How long per-version online statistics are kept in Redis."
    )
    actions: CsvTuple = Field(
        ("click",),
        description="ClickEvent actions that count as a click on a served item (comma-separated).",
    )
    redis_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Socket timeout of the outcomes worker's Redis calls (a join script over a "
        "batch of served records can outlast redis_timeout_s on a loaded host; a timed-out batch "
        "is retried, which the join makes harmless).",
    )
    export_interval_s: float = Field(
        15.0,
        ge=0,
        description="How often an outcomes worker refreshes its online-metric gauges (10 min and "
        "1 h windows of every version that served in the last hour: one HGETALL per version and "
        "statistics bucket); 0 turns the export off.",
    )
    batch_max: int = Field(
        500, ge=1, description="Most records (served log and clicks) per outcomes-worker batch."
    )
