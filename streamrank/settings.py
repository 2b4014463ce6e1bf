"""One frozen settings object, read from ``STREAMRANK_*`` environment variables.

Every field below is documented in README.md ("Settings"); the defaults are the ones a
single-host demo on the embedded stack wants. An optional dotenv-style file can be named by
``STREAMRANK_SETTINGS_FILE`` (default ``streamrank.env`` in the working directory, if present).
Environment variables win over the file.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]
IsolationLevel = Literal["read_committed", "read_uncommitted"]


def _default_data_dir() -> Path:
    return Path(__file__).resolve().parent.parent.parent / "shared" / "datasets"


class Settings(BaseSettings):
    """All runtime configuration. Construct with :func:`get_settings` or ``Settings(**overrides)``."""

    model_config = SettingsConfigDict(
        env_prefix="STREAMRANK_",
        frozen=True,
        extra="ignore",
        env_file=os.environ.get("STREAMRANK_SETTINGS_FILE", "streamrank.env"),
        env_file_encoding="utf-8",
    )

    # --- connections -------------------------------------------------------------------------
    kafka_bootstrap: str = Field(
        "", description="Kafka bootstrap servers, comma-separated; default: the embedded broker."
    )
    kafka_security_protocol: SecurityProtocol = Field(
        "PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    )
    kafka_sasl_mechanism: SaslMechanism | None = Field(
        None, description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."
    )
    kafka_sasl_username: str | None = Field(None, description="SASL user name.")
    kafka_sasl_password: SecretStr | None = Field(None, description="SASL password (secret).")
    kafka_ssl_cafile: Path | None = Field(None, description="CA bundle for Kafka TLS.")
    kafka_ssl_certfile: Path | None = Field(None, description="Client certificate for Kafka mTLS.")
    kafka_ssl_keyfile: Path | None = Field(None, description="Client key for Kafka mTLS.")
    kafka_compression: Compression = Field(
        "none",
        description="compression.type of every producer of ours (replies, dead letters, "
        "forwarded clicks, served log): none, gzip, snappy, lz4 or zstd. Consumers read all of "
        "them whatever this says.",
    )
    kafka_isolation_level: IsolationLevel = Field(
        "read_committed",
        description="isolation.level of every consumer of ours: read_committed never turns an "
        "aborted transaction into features or replies.",
    )
    kafka_group_instance_id: str | None = Field(
        None,
        description="Static consumer-group membership: a stable id, unique per worker instance "
        "(in Kubernetes the pod name), so a restarted worker gets its partitions back without a "
        "group-wide rebalance. Needs a session timeout longer than a restart.",
    )
    kafka_session_timeout_ms: int = Field(
        6000,
        ge=1000,
        description="Consumer-group session timeout of both workers: a worker silent this long "
        "is presumed dead and its partitions move to the others.",
    )
    kafka_heartbeat_interval_ms: int = Field(
        1000, ge=100, description="How often both workers heartbeat to the group coordinator."
    )
    kafka_start_timeout_s: float = Field(
        300.0,
        ge=0,
        description="How long a worker that finds Kafka unreachable at start keeps retrying "
        "(with back-off, one log line) before it exits with an error; 0: try once.",
    )
    redis_url: SecretStr = Field(
        SecretStr(""),
        description="Redis URL (rediss:// for TLS; may carry a password, so kept secret); "
        "default: the embedded Redis.",
    )
    redis_ssl_ca_certs: Path | None = Field(None, description="CA bundle for rediss:// URLs.")
    redis_timeout_s: float = Field(
        0.25,
        gt=0,
        description="Socket timeout of every Redis call (the scoring worker's ranking calls "
        "wait up to the request's deadline instead, when scoring_budget_ms is longer).",
    )
    redis_cluster: bool = Field(
        False,
        description="Redis Cluster: the URL names one node (any: the others are discovered); "
        "implied by a redis+cluster:// or rediss+cluster:// URL. Password and TLS as for "
        "standalone.",
    )
    redis_cluster_nodes: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="More Redis Cluster startup nodes, host:port comma-separated: tried when "
        "the URL's node does not answer at start.",
    )
    redis_sentinels: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Redis Sentinel: the Sentinels' host:port, comma-separated. Redis is then "
        "the master they name redis_sentinel_master (found again after a failover); the URL "
        "gives only its password, database and TLS.",
    )
    redis_sentinel_master: str = Field(
        "mymaster", description="The master name the Sentinels monitor (sentinel monitor NAME)."
    )
    redis_sentinel_password: SecretStr | None = Field(
        None, description="Password of the Sentinels themselves, when they require one (secret)."
    )
    redis_wait_replicas: int = Field(
        0,
        ge=0,
        description="The features worker counts a batch as durable only once this many "
        "replicas of every Redis node it wrote (or all the node has, if fewer) acknowledge it "
        "(WAIT), so a failover cannot lose an acknowledged click; 0: the master's reply is "
        "enough.",
    )
    redis_wait_timeout_ms: int = Field(
        1000,
        ge=1,
        description="Longest wait for redis_wait_replicas; a batch not replicated by then is "
        "retried (a no-op where it was applied).",
    )

    # --- embedded stack (demo and tests) -----------------------------------------------------
    run_dir: Path = Field(
        Path(".run"), description="Pid, log and data files of the embedded stack."
    )
    stack_kafka_port: int = Field(9092, ge=0, le=65535, description="Port of the embedded broker.")
    stack_redis_port: int = Field(6379, ge=0, le=65535, description="Port of the embedded Redis.")

    # --- topics ------------------------------------------------------------------------------
    topic_clicks: str = Field("clicks", description="ClickEvent topic (key = user_id).")
    topic_requests: str = Field("rank-requests", description="RankRequest topic (key = user_id).")
    topic_results: str = Field("rank-results", description="RankResult topic (key = request_id).")
    topic_dead_letters: str = Field("dead-letters", description="DeadLetter topic.")
    topic_partitions: int = Field(
        4, ge=1, description="Partitions per topic: bounds group scale-out."
    )
    topic_replication: int = Field(1, ge=1, description="Replication factor of created topics.")
    reply_topics_allowed: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Extra topics a RankRequest may name in reply_to (comma-separated)."
    )

    # --- message limits ----------------------------------------------------------------------
    max_message_bytes: int = Field(
        64 * 1024, ge=256, description="Larger messages are dead-lettered."
    )
    max_items_per_request: int = Field(
        500, ge=1, description="Candidates allowed in one RankRequest."
    )
    max_id_length: int = Field(128, ge=1, description="Longest id (user, item, event, request).")
    max_event_skew_s: int = Field(
        7 * 24 * 3600,
        ge=1,
        description="Clicks whose ts is further than this from now are dead-lettered.",
    )

    # --- features (streams) ------------------------------------------------------------------
    sequence_length: int = Field(50, ge=1, description="Events kept per user sequence.")
    sequence_ttl_s: int = Field(
        30 * 24 * 3600, ge=1, description="Idle time after which a sequence expires."
    )
    counter_bucket_s: int = Field(300, ge=1, description="Fine bucket size for the 1 h windows.")
    counter_lateness_s: int = Field(600, ge=0, description="Allowed lateness of event time.")
    dedupe_ttl_s: int = Field(48 * 3600, ge=1, description="How long an event_id is remembered.")
    features_batch_size: int = Field(2000, ge=1, description="Max clicks per feature-worker batch.")
    features_batch_within_s: float = Field(
        0.05, gt=0, description="Max wait to fill a click batch."
    )
    counter_coarse_bucket_s: int = Field(
        3600, ge=1, description="Coarse bucket size for the 24 h windows (and category counts)."
    )
    features_app_id: str = Field(
        "streamrank-features", description="Faust app id = the features consumer group id."
    )
    features_path: Literal["batch", "agent"] = Field(
        "batch",
        description="How the Faust worker hands clicks over: 'batch' drains whole fetches from "
        "Faust's consumer into the batch writer; 'agent' uses a Faust agent stream (slower).",
    )
    features_retry_max_s: float = Field(
        2.0, gt=0, description="Longest back-off between retries while Redis/Kafka is down."
    )
    features_fetch_max_wait_ms: int = Field(
        10,
        ge=0,
        description="Longest time the broker may hold a features fetch waiting for data (Faust "
        "hard-codes 1500 ms, which would add up to that much click-to-visible latency).",
    )
    features_redis_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Socket timeout of the features worker's batch writes (a 2,000-event script "
        "can outlast redis_timeout_s on a loaded host; a timed-out batch is retried).",
    )
    features_max_inflight_batches: int = Field(
        2,
        ge=1,
        description="Batches the features worker has in flight at once (batch path): the next "
        "fetch is decoded while Redis applies the previous one; 1 = strictly one at a time.",
    )
    features_commit_interval_s: float = Field(
        0.5, gt=0, description="How often the features worker commits acked offsets."
    )

    # --- embedding store and cache -----------------------------------------------------------
    embedding_encoding: Literal["fp32", "fp16", "int8"] = Field(
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
    embedding_configure_redis: bool = Field(
        True,
        description="Let the embedding store CONFIG SET hash-max-ziplist-value when rows are "
        "longer than the server's limit (else publish refuses with instructions).",
    )
    embedding_fetch_mode: Literal["script", "pipeline"] = Field(
        "script",
        description="One Lua call per batch of misses (per slot on a cluster), or a pipeline "
        "of HMGET per bucket.",
    )
    embedding_shards: int = Field(
        16,
        ge=1,
        description="Hash tags a published embedding table's buckets are grouped into: on a "
        "cluster, up to this many slots (and masters) hold one table, and a fetch makes up to "
        "this many script calls. Kept per table in its meta; applies to new publishes.",
    )

    # --- model and scoring -------------------------------------------------------------------
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Datasets folder (default ../shared/datasets).",
    )
    artifacts_dir: Path = Field(
        Path("artifacts"), description="Where `streamrank train` writes versions."
    )
    scoring_batch_max: int = Field(32, ge=1, description="Max requests per micro-batch.")
    scoring_batch_wait_ms: float = Field(
        0.0,
        ge=0,
        description="Max wait to fill a micro-batch once a request is in (0: take what has "
        "arrived; at saturation batches fill anyway).",
    )
    scoring_budget_ms: int = Field(
        50, ge=1, description="Default deadline when a request has none."
    )
    torch_threads: int = Field(
        1,
        ge=1,
        description="torch intra-op threads per process. Keep 1 and scale with worker "
        "processes, at most one per core left free by Redis, the broker and the rest of the host: "
        "the forward's ops are too small to gain from a second thread, which only costs hand-overs "
        "(docs/benchmarks.md, 'Model cost').",
    )
    torch_interop_threads: int = Field(
        1,
        ge=1,
        description="torch inter-op threads per process; 1 (the DIN forward is one chain of ops).",
    )
    scoring_dense_weights: Literal["fp32", "int8"] = Field(
        "fp32",
        description="How the scoring worker serves the DIN's dense weights: fp32 (as trained) or "
        "int8 (torch dynamic quantisation of the attention unit's Linear layers; the head stays "
        "fp32). int8 keeps the AUC but is slower for one request at these layer sizes, so fp32 "
        "is the default (docs/benchmarks.md, 'Model cost'). `streamrank replay` scores offline "
        "with the same option.",
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
    served_log_topic: str | None = Field(None, description="Topic for what-the-model-saw records.")
    scoring_group_id: str = Field(
        "streamrank-scoring", description="Consumer group of scoring workers."
    )
    scoring_forward: Literal["batched", "per_request"] = Field(
        "per_request",
        description="One DIN forward per micro-batch (padded across requests) or one per request.",
    )
    scoring_fetch_wait_ms: int = Field(
        2,
        ge=0,
        description="Longest a broker may hold a fetch of the scoring worker or RankClient "
        "(the embedded Tansu broker always holds it this long: it bounds the latency per hop).",
    )
    scoring_pipeline_depth: int = Field(
        2,
        ge=1,
        description="Micro-batches in flight in a scoring worker: one batch's compute overlaps "
        "the other's Redis and broker round trips; offsets still commit in order.",
    )
    scoring_commit_interval_ms: int = Field(
        100,
        ge=0,
        description="Scoring workers commit answered offsets at most this often (0: after "
        "every batch); a crash in between only repeats replies, it never loses a request.",
    )
    scoring_poll_s: float = Field(
        1.0, gt=0, description="How often the scoring worker polls the model version pointers."
    )

    # --- online outcomes and rollouts --------------------------------------------------------
    outcomes_group_id: str = Field(
        "streamrank-outcomes",
        description="Consumer group of outcomes workers (they read the served log and the clicks).",
    )
    outcome_window_s: int = Field(
        1800,
        ge=1,
        description="Attribution window: a click on a ranked item at most this long after the "
        "request was served counts for that request (the latest such request: last touch).",
    )
    outcome_close_delay_s: int = Field(
        60,
        ge=0,
        description="How long after its window ends a served record stays open for clicks that "
        "are processed late (consumer lag); then its outcome is final.",
    )
    outcome_bucket_s: int = Field(
        60,
        ge=1,
        description="Time bucket of the per-version online statistics in Redis: the resolution of "
        "rolling windows and rollout steps.",
    )
    outcome_retention_s: int = Field(
        24 * 3600, ge=60, description="How long per-version online statistics are kept in Redis."
    )
    outcome_actions: Annotated[tuple[str, ...], NoDecode] = Field(
        ("click",),
        description="ClickEvent actions that count as a click on a served item (comma-separated).",
    )
    outcomes_topic: str | None = Field(
        None,
        description="Topic the outcomes worker writes each final outcome to (key = request_id: "
        "which ranked items were clicked, at which rank); unset: none written.",
    )
    outcomes_redis_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Socket timeout of the outcomes worker's Redis calls (a join script over a "
        "batch of served records can outlast redis_timeout_s on a loaded host; a timed-out batch "
        "is retried, which the join makes harmless).",
    )
    outcomes_export_interval_s: float = Field(
        15.0,
        ge=0,
        description="How often an outcomes worker refreshes its online-metric gauges (10 min and "
        "1 h windows of every version that served in the last hour: one HGETALL per version and "
        "statistics bucket); 0 turns the export off.",
    )
    outcomes_batch_max: int = Field(
        500, ge=1, description="Most records (served log and clicks) per outcomes-worker batch."
    )

    # --- observability -----------------------------------------------------------------------
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="/metrics port; 0 disables; unset = per-worker default."
    )
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ERROR.")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text, or json: one JSON object per line with request_id, user_id and "
        "model_version on lines about a request and topic/partition/offset on lines about a "
        "record (docs/operations.md, Logs).",
    )

    @model_validator(mode="before")
    @classmethod
    def _embedded_defaults(cls, data: Any) -> Any:
        """Unset endpoints point at the embedded stack's ports."""
        if isinstance(data, dict):
            if not data.get("kafka_bootstrap"):
                data["kafka_bootstrap"] = f"127.0.0.1:{data.get('stack_kafka_port', 9092)}"
            if not data.get("redis_url"):
                data["redis_url"] = f"redis://127.0.0.1:{data.get('stack_redis_port', 6379)}/0"
        return data

    @field_validator(
        "reply_topics_allowed",
        "redis_cluster_nodes",
        "redis_sentinels",
        "outcome_actions",
        mode="before",
    )
    @classmethod
    def _split_csv(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @property
    def redis_dsn(self) -> str:
        """The Redis URL as redis-py takes it (a ``+cluster`` scheme suffix removed)."""
        return self.redis_url.get_secret_value().replace("+cluster://", "://", 1)

    @model_validator(mode="after")
    def _one_redis_mode(self) -> Settings:
        if self.redis_sentinels and self.redis_is_cluster:
            raise ValueError(
                "STREAMRANK_REDIS_SENTINELS and a Redis Cluster (STREAMRANK_REDIS_CLUSTER or a "
                "+cluster URL) exclude each other: set one"
            )
        return self

    @property
    def redis_is_cluster(self) -> bool:
        """Whether Redis is a cluster (the setting, or a ``redis+cluster://`` URL)."""
        scheme = self.redis_url.get_secret_value().partition("://")[0]
        return self.redis_cluster or scheme.endswith("+cluster")

    @property
    def redis_mode(self) -> str:
        """``standalone``, ``sentinel`` or ``cluster``."""
        if self.redis_is_cluster:
            return "cluster"
        return "sentinel" if self.redis_sentinels else "standalone"

    def all_topics(self) -> tuple[str, ...]:
        """Every topic the settings name (the served log and outcomes topics when set)."""
        base = (self.topic_clicks, self.topic_requests, self.topic_results, self.topic_dead_letters)
        return base + tuple(t for t in (self.served_log_topic, self.outcomes_topic) if t)

    def as_env(self) -> dict[str, str]:
        """``STREAMRANK_*`` variables that hand every field to a child process (workers)."""
        env: dict[str, str] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if isinstance(value, tuple):
                value = ",".join(value)
            if value is not None:
                env[f"STREAMRANK_{name.upper()}"] = str(value)
        return env

    def kafka_client_kwargs(self) -> dict[str, Any]:
        """Connection keyword arguments shared by every aiokafka client (TLS/SASL passed through)."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.kafka_bootstrap,
            "security_protocol": self.kafka_security_protocol,
        }
        if self.kafka_security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            kwargs["ssl_context"] = create_ssl_context(
                cafile=str(self.kafka_ssl_cafile) if self.kafka_ssl_cafile else None,
                certfile=str(self.kafka_ssl_certfile) if self.kafka_ssl_certfile else None,
                keyfile=str(self.kafka_ssl_keyfile) if self.kafka_ssl_keyfile else None,
            )
        if self.kafka_sasl_mechanism:
            kwargs["sasl_mechanism"] = self.kafka_sasl_mechanism
            kwargs["sasl_plain_username"] = self.kafka_sasl_username
            kwargs["sasl_plain_password"] = (
                self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password else None
            )
        return kwargs

    def redis_client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``redis.asyncio.from_url`` (timeouts, TLS CA)."""
        kwargs: dict[str, Any] = {
            "socket_timeout": self.redis_timeout_s,
            "socket_connect_timeout": self.redis_timeout_s,
        }
        if self.redis_ssl_ca_certs:
            kwargs["ssl_ca_certs"] = str(self.redis_ssl_ca_certs)
        return kwargs


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
