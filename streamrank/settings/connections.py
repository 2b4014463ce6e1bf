"""Connection settings: the Kafka cluster and the Redis every worker talks to."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from streamrank.settings.base import CsvTuple, Section

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]
IsolationLevel = Literal["read_committed", "read_uncommitted"]


class KafkaSettings(Section):
    """The Kafka cluster: endpoints, TLS/SASL, producer and consumer-group options."""

    env_prefix = "STREAMRANK_KAFKA_"

    bootstrap: str = Field(
        "", description="Kafka bootstrap servers, comma-separated; default: the embedded broker."
    )
    security_protocol: SecurityProtocol = Field(
        "PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    )
    sasl_mechanism: SaslMechanism | None = Field(
        None, description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."
    )
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(None, description="SASL password (secret).")
    ssl_cafile: Path | None = Field(None, description="CA bundle for Kafka TLS.")
    ssl_certfile: Path | None = Field(None, description="Client certificate for Kafka mTLS.")
    ssl_keyfile: Path | None = Field(None, description="Client key for Kafka mTLS.")
    compression: Compression = Field(
        "none",
        description="compression.type of every producer of ours (replies, dead letters, "
        "forwarded clicks, served log): none, gzip, snappy, lz4 or zstd. Consumers read all of "
        "them whatever this says.",
    )
    isolation_level: IsolationLevel = Field(
        "read_committed",
        description="isolation.level of every consumer of ours: read_committed never turns an "
        "aborted transaction into features or replies.",
    )
    group_instance_id: str | None = Field(
        None,
        description="Static consumer-group membership: a stable id, unique per worker instance "
        "(in Kubernetes the pod name), so a restarted worker gets its partitions back without a "
        "group-wide rebalance. Needs a session timeout longer than a restart.",
    )
    session_timeout_ms: int = Field(
        6000,
        ge=1000,
        description="Consumer-group session timeout of both workers: a worker silent this long "
        "is presumed dead and its partitions move to the others.",
    )
    heartbeat_interval_ms: int = Field(
        1000, ge=100, description="How often both workers heartbeat to the group coordinator."
    )
    start_timeout_s: float = Field(
        300.0,
        ge=0,
        description="How long a worker that finds Kafka unreachable at start keeps retrying "
        "(with back-off, one log line) before it exits with an error; 0: try once.",
    )

    def client_kwargs(self) -> dict[str, Any]:
        """Connection keyword arguments shared by every aiokafka client (TLS/SASL passed through)."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            kwargs["ssl_context"] = create_ssl_context(
                cafile=str(self.ssl_cafile) if self.ssl_cafile else None,
                certfile=str(self.ssl_certfile) if self.ssl_certfile else None,
                keyfile=str(self.ssl_keyfile) if self.ssl_keyfile else None,
            )
        if self.sasl_mechanism:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = (
                self.sasl_password.get_secret_value() if self.sasl_password else None
            )
        return kwargs


class RedisSettings(Section):
    """The Redis of features, embeddings and model versions: standalone, Sentinel or Cluster."""

    env_prefix = "STREAMRANK_REDIS_"

    url: SecretStr = Field(
        SecretStr(""),
        description="Redis URL (rediss:// for TLS; may carry a password, so kept secret); "
        "default: the embedded Redis.",
    )
    ssl_ca_certs: Path | None = Field(None, description="CA bundle for rediss:// URLs.")
    timeout_s: float = Field(
        0.25,
        gt=0,
        description="Socket timeout of every Redis call (the scoring worker's ranking calls "
        "wait up to the request's deadline instead, when scoring_budget_ms is longer).",
    )
    cluster: bool = Field(
        False,
        description="Redis Cluster: the URL names one node (any: the others are discovered); "
        "implied by a redis+cluster:// or rediss+cluster:// URL. Password and TLS as for "
        "standalone.",
    )
    cluster_nodes: CsvTuple = Field(
        (),
        description="More Redis Cluster startup nodes, host:port comma-separated: tried when "
        "the URL's node does not answer at start.",
    )
    sentinels: CsvTuple = Field(
        (),
        description="Redis Sentinel: the Sentinels' host:port, comma-separated. Redis is then "
        "the master they name redis_sentinel_master (found again after a failover); the URL "
        "gives only its password, database and TLS.",
    )
    sentinel_master: str = Field(
        "mymaster", description="The master name the Sentinels monitor (sentinel monitor NAME)."
    )
    sentinel_password: SecretStr | None = Field(
        None, description="Password of the Sentinels themselves, when they require one (secret)."
    )
    wait_replicas: int = Field(
        0,
        ge=0,
        description="The features worker counts a batch as durable only once this many "
        "replicas of every Redis node it wrote (or all the node has, if fewer) acknowledge it "
        "(WAIT), so a failover cannot lose an acknowledged click; 0: the master's reply is "
        "enough.",
    )
    wait_timeout_ms: int = Field(
        1000,
        ge=1,
        description="Longest wait for redis_wait_replicas; a batch not replicated by then is "
        "retried (a no-op where it was applied).",
    )

    @model_validator(mode="after")
    def _one_redis_mode(self) -> RedisSettings:
        if self.sentinels and self.is_cluster:
            raise ValueError(
                "STREAMRANK_REDIS_SENTINELS and a Redis Cluster (STREAMRANK_REDIS_CLUSTER or a "
                "+cluster URL) exclude each other: set one"
            )
        return self

    @property
    def dsn(self) -> str:
        """The Redis URL as redis-py takes it (a ``+cluster`` scheme suffix removed)."""
        return self.url.get_secret_value().replace("+cluster://", "://", 1)

    @property
    def is_cluster(self) -> bool:
        """Whether Redis is a cluster (the setting, or a ``redis+cluster://`` URL)."""
        scheme = self.url.get_secret_value().partition("://")[0]
        return self.cluster or scheme.endswith("+cluster")

    @property
    def mode(self) -> str:
        """``standalone``, ``sentinel`` or ``cluster``."""
        if self.is_cluster:
            return "cluster"
        return "sentinel" if self.sentinels else "standalone"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``redis.asyncio.from_url`` (timeouts, TLS CA)."""
        kwargs: dict[str, Any] = {
            "socket_timeout": self.timeout_s,
            "socket_connect_timeout": self.timeout_s,
        }
        if self.ssl_ca_certs:
            kwargs["ssl_ca_certs"] = str(self.ssl_ca_certs)
        return kwargs
