"""The consumer-group metrics every worker kind exports, under its own prefix.

``{prefix}_consumer_lag{topic,partition}``, ``{prefix}_commits{result}``,
``{prefix}_rebalances``, ``{prefix}_last_rebalance_seconds``, ``{prefix}_assigned_partitions``,
``{prefix}_event_loop_lag_seconds``, ``{prefix}_gc_pause_seconds{generation}`` and, for a worker that reports its dependencies, ``{prefix}_dependency_up{dependency}``. Each
worker's metrics class extends :class:`GroupMetrics` with its own families in the same registry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

logger = logging.getLogger(__name__)

LagHandler = Callable[[str, int, int], None]  # (topic, partition, records behind)
LOOP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, float("inf"))


@dataclass(frozen=True, slots=True)
class Wording:
    """How the help texts name what the worker consumes."""

    items: str  # "Records", "Requests"
    after: str  # "the last durable batch"
    committed: str  # "applied clicks"
    topic: str  # "the clicks topic"


class GroupMetrics:
    """The group-consumer family of one worker, in an injected registry (a fresh one if None)."""

    def __init__(
        self,
        registry: CollectorRegistry | None,
        *,
        prefix: str,
        wording: Wording,
        dependencies: Sequence[str] = (),
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r, p, w = self.registry, prefix, wording
        self.consumer_lag = Gauge(
            f"{p}_consumer_lag",
            f"{w.items} behind the partition's high watermark after {w.after}.",
            ["topic", "partition"],
            registry=r,
        )
        self.commits = Counter(
            f"{p}_commits",
            f"Offset commits of {w.committed}, by result (ok, failed).",
            ["result"],
            registry=r,
        )
        self.rebalances = Counter(
            f"{p}_rebalances",
            "Consumer-group rebalances this worker went through (each new assignment).",
            registry=r,
        )
        self.last_rebalance = Gauge(
            f"{p}_last_rebalance_seconds",
            "Duration of the last rebalance: partitions revoked (or the join started) until the "
            "new assignment arrived.",
            registry=r,
        )
        self.assigned_partitions = Gauge(
            f"{p}_assigned_partitions",
            f"Partitions of {w.topic} this worker owns now.",
            registry=r,
        )
        self.dependency_up: Gauge | None = None
        if dependencies:
            self.dependency_up = Gauge(
                f"{p}_dependency_up",
                "1 while the dependency answers, 0 during an outage.",
                ["dependency"],
                registry=r,
            )
            for dependency in dependencies:
                self.dependency_up.labels(dependency).set(1)
        self.loop_lag = Histogram(
            f"{p}_event_loop_lag_seconds",
            "How much later than due the event loop's timers fired (sampled every 50 ms): time "
            "it spent running something without yielding.",
            buckets=LOOP_BUCKETS,
            registry=r,
        )
        self.gc_pause = Histogram(
            f"{p}_gc_pause_seconds",
            "Garbage-collector pauses of the worker process, by generation.",
            ["generation"],
            buckets=LOOP_BUCKETS,
            registry=r,
        )
        self._lag_partitions: set[tuple[str, str]] = set()

    def gc_paused(self, generation: int, seconds: float) -> None:
        self.gc_pause.labels(str(generation)).observe(seconds)

    def set_lag(self, topic: str, partition: int, lag: int) -> None:
        self._lag_partitions.add((topic, str(partition)))
        self.consumer_lag.labels(topic, str(partition)).set(lag)

    def assigned(self, partitions: Iterable[tuple[str, int]], *, rebalance_s: float) -> None:
        """A new assignment: lag rows of partitions this worker no longer owns go."""
        mine = {(t, str(p)) for t, p in partitions}
        for labels in self._lag_partitions - mine:
            self.consumer_lag.remove(*labels)
        self._lag_partitions &= mine
        self.rebalances.inc()
        self.last_rebalance.set(rebalance_s)
        self.assigned_partitions.set(len(mine))

    def committed(self, ok: bool) -> None:
        self.commits.labels("ok" if ok else "failed").inc()

    def dependency(self, name: str, up: bool) -> None:
        """Whether ``name`` (one of the dependencies given at construction) answers now."""
        assert self.dependency_up is not None, "built without dependencies"
        self.dependency_up.labels(name).set(1 if up else 0)


def report_lag(
    last: Mapping[Any, int],
    *,
    assigned: Container[Any],
    highwater: Callable[[Any], int | None],
    on_lag: LagHandler,
) -> None:
    """Records behind each partition's high watermark once its offset ``last[tp]`` is done, for
    the partitions still assigned: a rebalance may have moved some away meanwhile, and aiokafka
    asserts assignment when reading a high watermark."""
    for tp, offset in last.items():
        if tp not in assigned:
            continue
        try:
            mark = highwater(tp)
        except AssertionError:  # revoked by another thread between the check and the read
            logger.debug("lag of %s skipped: no longer assigned", tp)
            continue
        if mark is not None:
            on_lag(tp.topic, tp.partition, max(0, mark - (offset + 1)))


async def commit_offsets(
    consumer: AIOKafkaConsumer,
    offsets: Mapping[TopicPartition, int],
    *,
    metrics: GroupMetrics,
    if_failed: str,
) -> bool:
    """Commit ``offsets`` (next offset to read, per partition) and count the result. A failed
    commit (a rebalance, the broker away) is logged with ``if_failed`` (what it means for this
    worker) and not raised: the work is done, the next commit or owner carries on."""
    try:
        await consumer.commit(dict(offsets))
    except (CommitFailedError, KafkaError) as exc:
        metrics.committed(False)
        logger.warning("offset commit failed (%s); %s", exc, if_failed)
        return False
    metrics.committed(True)
    return True
