"""Every metric of the features worker, built in one place from an injected registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from streamrank.runtime.group_metrics import GroupMetrics, Wording

BATCH_SIZE_BUCKETS = (1, 5, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10000)
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


WORDING = Wording(
    items="Records",
    after="the last durable batch",
    committed="applied clicks",
    topic="the clicks topic",
)


class FeatureMetrics(GroupMetrics):
    """The features worker's metrics (prefix ``streamrank_features_``; the consumer-group family
    and ``dependency_up`` of redis and kafka from :class:`GroupMetrics`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        p = "streamrank_features"
        super().__init__(registry, prefix=p, wording=WORDING, dependencies=("redis", "kafka"))
        r = self.registry
        self.events_applied = Counter(
            f"{p}_events_applied", "Clicks applied to Redis for the first time.", registry=r
        )
        self.events_duplicate = Counter(
            f"{p}_events_duplicate",
            "Clicks skipped because their event_id was already applied (redelivery).",
            registry=r,
        )
        self.events_forwarded = Counter(
            f"{p}_events_forwarded",
            "Unkeyed clicks re-produced to the clicks topic keyed by user_id.",
            registry=r,
        )
        self.events_too_old = Counter(
            f"{p}_events_too_old",
            "Clicks added to the sequence but too old for every counter window.",
            registry=r,
        )
        self.dead_letters = Counter(
            f"{p}_dead_letters",
            "Records (clicks, item events) sent to the dead-letter topic.",
            ["reason"],
            registry=r,
        )
        self.items_written = Counter(
            f"{p}_items_written",
            "Item events written to the item attribute table (at least as new as its value).",
            registry=r,
        )
        self.items_stale = Counter(
            f"{p}_items_stale",
            "Item events not written: the table holds a newer event of that item.",
            registry=r,
        )
        self.skipped_records = Counter(
            f"{p}_skipped_records",
            "Offsets of record batches that could not be decoded and were skipped (each such "
            "batch is one dead letter with reason undecodable_batch naming the offsets).",
            registry=r,
        )
        self.batch_size = Histogram(
            f"{p}_batch_size",
            "Records per processed batch.",
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.redis_write_seconds = Histogram(
            f"{p}_redis_write_seconds",
            "Duration of one batch's Redis write (one round trip).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            f"{p}_batch_seconds",
            "Duration of processing one batch (decode, write, produce, ack).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.append_to_durable = Histogram(
            f"{p}_append_to_durable_seconds",
            "Per batch: now, when the batch is durable, minus the Kafka timestamp of its oldest "
            "record (the worker's share of click-to-visible latency, broker included).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.event_time_lag = Gauge(
            f"{p}_event_time_lag_seconds",
            "Now minus the event time of the newest event of the last applied batch.",
            registry=r,
        )
        self.fetch_wait = Gauge(
            f"{p}_fetch_wait_seconds",
            "The wait the clicks consumer asks the broker to hold a fetch: "
            "features_fetch_max_wait_ms, raised while the broker answers fetches empty although "
            "clicks wait.",
            registry=r,
        )
        self.retries = Counter(
            f"{p}_retries",
            "Batch retries because Redis or Kafka did not answer.",
            ["dependency"],
            registry=r,
        )
