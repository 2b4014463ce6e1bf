"""The Prometheus alert rules and the Grafana dashboard only use metrics the workers export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from scoring.embeddings.metrics import EmbeddingCacheMetrics, OverlayMetrics
from scoring.rollout.metrics import OutcomeMetrics, RolloutMetrics
from scoring.serving.metrics import ScoringMetrics
from streams.metrics import FeatureMetrics

ROOT = Path(__file__).resolve().parents[3]
_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def exported_names() -> set[str]:
    registry = CollectorRegistry()
    FeatureMetrics(registry)
    ScoringMetrics(registry)
    EmbeddingCacheMetrics.build(registry)
    OverlayMetrics(registry)
    OutcomeMetrics(registry)
    RolloutMetrics(registry)
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in _SUFFIXES)
    return names


def used_names(text: str) -> set[str]:
    return set(re.findall(r"\bstreamrank_[a-z0-9_]+", text))


def test_alert_rules_use_exported_metrics() -> None:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    exprs = " ".join(rule["expr"] for group in rules["groups"] for rule in group["rules"])
    assert used_names(exprs), "no streamrank metric in the alert rules"
    assert used_names(exprs) <= exported_names(), used_names(exprs) - exported_names()


def test_dashboard_uses_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/streamrank.json").read_text())
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    assert used_names(exprs) <= exported_names(), used_names(exprs) - exported_names()
