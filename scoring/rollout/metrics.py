"""Every metric of the outcomes worker and of the rollout driver, built from an injected
registry. Online metrics are labelled by model version and rolling window (``10m``, ``1h``),
with ``bound`` = ``value``, ``lo`` or ``hi`` (the 95 % interval)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

from scoring.rollout.cycles import RetrainCycle, last_by_outcome
from scoring.rollout.join import JoinCounts
from scoring.rollout.stats import Estimate, Summary
from streamrank.runtime.group_metrics import GroupMetrics, Wording

BOUNDS = ("value", "lo", "hi")


OUTCOMES_WORDING = Wording(
    items="Records",
    after="the last joined batch",
    committed="joined records",
    topic="the served log and the clicks",
)


class OutcomeMetrics(GroupMetrics):
    """The outcomes worker: what the join did, and the online metrics it exports (the
    consumer-group family from :class:`GroupMetrics`, prefix ``streamrank_outcomes``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry, prefix="streamrank_outcomes", wording=OUTCOMES_WORDING)
        self.served = Counter(
            "streamrank_outcomes_served_records",
            "Served-log records read, by result: joined, degraded (counted, not joined), "
            "duplicate (redelivered: skipped).",
            ["result"],
            registry=self.registry,
        )
        self.clicks = Counter(
            "streamrank_outcomes_clicks",
            "Clicks read, by result: attributed (to an open served record), repeated (that item "
            "of that request was clicked before), waiting (no open record yet), stale (older "
            "than any open window), ignored (an action that does not count).",
            ["result"],
            registry=self.registry,
        )
        self.closed = Counter(
            "streamrank_outcomes_closed",
            "Outcomes made final (their attribution window closed).",
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "streamrank_outcomes_dead_letters",
            "Served-log records dead-lettered, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.skipped_clicks = Counter(
            "streamrank_outcomes_skipped_clicks",
            "Clicks that break their contract (the features worker dead-letters them), by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.redis_errors = Counter(
            "streamrank_outcomes_redis_errors",
            "Redis calls of the outcomes worker that failed (the batch is retried).",
            registry=self.registry,
        )
        self.open_records = Gauge(
            "streamrank_outcomes_open_records",
            "Served records waiting for their attribution window to close.",
            registry=self.registry,
        )
        self.requests = Gauge(
            "streamrank_online_requests",
            "Model-scored requests of a version in a rolling window (by served time).",
            ["version", "window"],
            registry=self.registry,
        )
        self.click_count = Gauge(
            "streamrank_online_clicks",
            "Clicked impressions of a version's requests in a rolling window.",
            ["version", "window"],
            registry=self.registry,
        )
        self.ctr = Gauge(
            "streamrank_online_ctr",
            "Share of a version's requests with a click in the top k (Wilson interval).",
            ["version", "window", "k", "bound"],
            registry=self.registry,
        )
        self.auc = Gauge(
            "streamrank_online_auc",
            "AUC of a version's served scores against the clicks (DeLong interval).",
            ["version", "window", "bound"],
            registry=self.registry,
        )
        self.gauc = Gauge(
            "streamrank_online_gauc",
            "Per-request AUC weighted by items (normal interval over requests).",
            ["version", "window", "bound"],
            registry=self.registry,
        )
        self.mrr = Gauge(
            "streamrank_online_mrr",
            "Mean reciprocal rank of the best-ranked click (0 without a click).",
            ["version", "window", "bound"],
            registry=self.registry,
        )
        self.p99 = Gauge(
            "streamrank_online_p99_seconds",
            "p99 of request produced -> reply built, of a version's replies.",
            ["version", "window", "bound"],
            registry=self.registry,
        )
        self.degraded = Gauge(
            "streamrank_online_degraded_ratio",
            "Share of the replies routed to a version that were degraded (Wilson interval).",
            ["version", "window", "bound"],
            registry=self.registry,
        )
        self.retrain_last = Gauge(
            "streamrank_retrain_last_cycle_timestamp_seconds",
            "When the retrain loop's latest cycle of each outcome finished (published, "
            "refused, skipped, failed).",
            ["outcome"],
            registry=self.registry,
        )
        self.retrain_gate = Gauge(
            "streamrank_retrain_gate_metric",
            "The gate metric on the held-out slice in the latest cycle that reached the gate, "
            "for the candidate and the active version.",
            ["role", "metric"],
            registry=self.registry,
        )
        self._exported: set[tuple[str, str]] = set()

    def export_cycles(self, cycles: Sequence[RetrainCycle]) -> None:
        """The retrain gauges from the latest cycles (newest first)."""
        for outcome, cycle in last_by_outcome(list(cycles)).items():
            self.retrain_last.labels(outcome).set(cycle.finished_ms / 1000.0)
        gated = next((c for c in cycles if c.gate.get("metric")), None)
        if gated is not None:
            metric = str(gated.gate["metric"])
            for role in ("candidate", "active"):
                value = (gated.gate.get(role) or {}).get(metric)
                if value is not None:
                    self.retrain_gate.labels(role, metric).set(float(value))

    def observe_join(self, counts: JoinCounts) -> None:
        self.served.labels("joined").inc(counts.joined)
        self.served.labels("degraded").inc(counts.degraded)
        self.served.labels("duplicate").inc(counts.duplicate_served)
        self.clicks.labels("attributed").inc(counts.clicks)
        self.clicks.labels("repeated").inc(counts.repeated_clicks)
        self.clicks.labels("waiting").inc(counts.buffered_clicks)

    def export(self, summaries: Mapping[tuple[str, str], Summary]) -> None:
        """Set the online gauges of each ``(version, window)``; series of versions that no
        longer serve are removed."""
        for version, window in self._exported - set(summaries):
            self._remove(version, window)
        for (version, window), s in summaries.items():
            self.requests.labels(version, window).set(s.requests)
            self.click_count.labels(version, window).set(s.clicks)
            for k, est in s.ctr.items():
                _set(self.ctr, est, version, window, str(k))
            _set(self.auc, s.auc, version, window)
            _set(self.gauc, s.gauc, version, window)
            _set(self.mrr, s.mrr, version, window)
            _set(self.p99, s.p99_ms, version, window, scale=0.001)
            _set(self.degraded, s.degraded, version, window)
        self._exported = set(summaries)

    def _remove(self, version: str, window: str) -> None:
        for gauge in (self.requests, self.click_count):
            _quietly_remove(gauge, version, window)
        for gauge in (self.auc, self.gauc, self.mrr, self.p99, self.degraded):
            for bound in BOUNDS:
                _quietly_remove(gauge, version, window, bound)
        for k in ("1", "5", "10"):
            for bound in BOUNDS:
                _quietly_remove(self.ctr, version, window, k, bound)


def _set(gauge: Gauge, est: Estimate, *labels: str, scale: float = 1.0) -> None:
    for bound, value in zip(BOUNDS, (est.value, est.lo, est.hi), strict=True):
        if value is None:
            _quietly_remove(gauge, *labels, bound)
        else:
            gauge.labels(*labels, bound).set(value * scale)


def _quietly_remove(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set: nothing to remove
        gauge.remove(*labels)


class RolloutMetrics:
    """The rollout driver: where the rollout stands and what it decided."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.share = Gauge(
            "streamrank_rollout_traffic_share",
            "Share of the traffic the rollout gives each version (new and old).",
            ["version", "role"],
            registry=r,
        )
        self.decisions = Counter(
            "streamrank_rollout_decisions",
            "Rollout decisions: advance, promote, rollback, pause, resume, abort.",
            ["action"],
            registry=r,
        )
        self.rollbacks = Counter(
            "streamrank_rollout_rollbacks",
            "Automatic rollbacks, by the guard check that failed.",
            ["check"],
            registry=r,
        )
        self.guard_diff = Gauge(
            "streamrank_rollout_guard_difference",
            "The guard's new - old difference (or the new version's value for absolute checks) "
            "with its interval, per check.",
            ["check", "bound"],
            registry=r,
        )

    def set_share(self, new: str, old: str, share: float) -> None:
        self.share.labels(new, "new").set(share)
        self.share.labels(old, "old").set(1.0 - share)
