"""The retrain gate: a candidate passes only when it is not worse than the active version on
the same held-out slice, with enough samples to decide."""

from __future__ import annotations

import pytest

from scoring.training.gate import GateRule, decide

RULE = GateRule(metric="gauc", tolerance=0.001, min_samples=100)


def test_a_better_or_equal_candidate_passes() -> None:
    d = decide({"gauc": 0.71, "n": 500}, {"gauc": 0.70, "n": 500}, RULE)
    assert d.passed and "+0.0100" in d.reason
    assert decide({"gauc": 0.6995, "n": 500}, {"gauc": 0.70}, RULE).passed  # within tolerance


def test_a_worse_candidate_is_refused_with_both_figures() -> None:
    d = decide({"gauc": 0.65, "n": 500}, {"gauc": 0.70, "n": 500}, RULE)
    assert not d.passed
    assert "0.6500" in d.reason and "0.7000" in d.reason and "worse" in d.reason
    assert d.to_json()["candidate"]["gauc"] == 0.65


def test_too_few_held_out_requests_are_refused_whatever_the_figures() -> None:
    d = decide({"gauc": 0.99, "n": 50}, {"gauc": 0.5}, RULE)
    assert not d.passed and "only 50" in d.reason


def test_a_candidate_without_the_metric_is_refused_and_no_active_version_passes() -> None:
    assert not decide({"gauc": None, "n": 500}, {"gauc": 0.7}, RULE).passed
    first = decide({"gauc": 0.6, "n": 500}, None, RULE)
    assert first.passed and "no active version" in first.reason


def test_the_rule_refuses_unknown_metrics_and_negative_tolerances() -> None:
    with pytest.raises(ValueError, match="gate metric"):
        GateRule(metric="ctr")
    with pytest.raises(ValueError, match="tolerance"):
        GateRule(tolerance=-0.1)
