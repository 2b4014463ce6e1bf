"""The served log joined with the final outcomes: labels and ranks per item, what is skipped
(degraded, not final, duplicates, filtered, mismatched) and counted, the time split."""

from __future__ import annotations

from typing import Any

import pytest

from scoring.rollout import stats
from scoring.training.served_data import (
    COLUMNS,
    ServedSample,
    join_served,
    ranks_by_score,
    summary,
    time_split,
)


def record(
    request_id: str, *, served_at: int = 1_000, version: str = "v1", **extra: Any
) -> dict[str, Any]:
    base: dict[str, Any] = {
        "request_id": request_id, "user_id": f"u-{request_id}", "model_version": version,
        "items": ["a", "b", "c"], "scores": [0.2, 0.9, 0.5], "served_at": served_at,
        "degraded": False, "latency_ms": 3.0,
        "sequence": {"item_ids": ["x", "y"], "ts": [10, 20], "event_ids": ["e1", "e2"],
                     "actions": ["click", None]},
        "features": {"as_of": served_at - 5, "codes": [3, 1], "counters": [[1, 2, 3, 4, 5]] * 3},
    }  # fmt: skip
    base.update(extra)
    return base


def outcome(request_id: str, clicked: list[tuple[str, int]], items: Any = None) -> dict[str, Any]:
    return {
        "request_id": request_id, "user_id": f"u-{request_id}", "model_version": "v1",
        "served_at": 1_000, "closed_at": 5_000, "items": items or ["a", "b", "c"],
        "clicked": [{"item": i, "rank": r, "event_id": f"c-{i}"} for i, r in clicked],
        "best_rank": min((r for _, r in clicked), default=None),
    }  # fmt: skip


def test_labels_ranks_scores_and_features_come_from_the_record_and_its_outcome() -> None:
    result = join_served([record("r1"), record("r2", served_at=900)],
                         [outcome("r1", [("a", 3), ("b", 1)]), outcome("r2", [])])  # fmt: skip
    assert [s.request_id for s in result.samples] == ["r2", "r1"]  # served_at order
    r1 = result.samples[1]
    assert r1.labels == (1, 1, 0) and r1.ranks == (3, 1, 2) and r1.scores == (0.2, 0.9, 0.5)
    assert result.samples[0].labels == (0, 0, 0)
    assert r1.history_items == ("x", "y") and r1.history_actions == ("click", None)
    assert r1.history_ts == (10, 20) and r1.history_event_ids == ("e1", "e2")
    assert r1.ts == 995 and r1.served_at == 1_000  # the features' as-of time
    assert r1.codes == (3, 1) and r1.counters == ((1, 2, 3, 4, 5),) * 3
    assert result.counts.joined == 2 and result.counts.served == 2


def test_degraded_not_final_duplicates_and_mismatched_are_skipped_and_counted() -> None:
    records = [
        record("ok"),
        record("deg", degraded=True, reason="timeout"),
        record("open"),  # no final outcome yet
        record("ok", scores=[0.0, 0.0, 0.0]),  # a redelivery: the first is kept
        record("moved"),
        {"user_id": "no id"},
        record("broken", sequence={"ts": []}),
    ]
    outcomes = [outcome("ok", [("c", 2)]), outcome("ok", []), outcome("deg", []),
                outcome("moved", [], items=["a", "b"]), outcome("broken", []),
                outcome("elsewhere", [])]  # fmt: skip
    result = join_served(records, outcomes)
    assert [s.request_id for s in result.samples] == ["ok"]
    assert result.samples[0].scores == (0.2, 0.9, 0.5) and result.samples[0].labels == (0, 0, 1)
    c = result.counts
    assert (c.served, c.joined, c.degraded, c.not_final, c.duplicate) == (7, 1, 1, 1, 1)
    assert (c.mismatched, c.invalid, c.outcomes, c.outcomes_duplicate) == (1, 2, 6, 1)
    assert c.outcomes_unmatched == 1


def test_filters_by_time_and_version() -> None:
    records = [record("early", served_at=500), record("in", served_at=1_000),
               record("late", served_at=2_000), record("other", version="v2")]  # fmt: skip
    outcomes = [outcome(r["request_id"], []) for r in records]
    result = join_served(records, outcomes, since_ms=600, until_ms=2_000, versions={"v1"})
    assert [s.request_id for s in result.samples] == ["in"]
    assert result.counts.filtered == 3


def test_a_record_without_features_has_no_codes_or_counters() -> None:
    bare = record("bare")
    del bare["features"]
    sample = join_served([bare], [outcome("bare", [("b", 1)])]).samples[0]
    assert sample.codes is None and sample.counters is None and sample.ts == sample.served_at


def test_ranks_follow_the_outcomes_worker_rule() -> None:
    for scores in ([0.1, 0.5, 0.5, 0.2], [1.0], [0.3, 0.3, 0.3], [0.9, 0.1, 0.4, 0.8]):
        assert ranks_by_score(scores) == stats.ranks_by_score(scores)


def test_rows_round_trip_and_name_every_column() -> None:
    sample = join_served([record("r")], [outcome("r", [("a", 3)])]).samples[0]
    row = sample.to_row()
    assert tuple(row) == COLUMNS
    assert ServedSample.from_row(row) == sample


def test_the_cold_start_map_is_carried_and_absent_for_records_without_one() -> None:
    cold = record("r1", cold_start={"b": ["Action", "Comedy"], "y": ["Drama"]})
    result = join_served([cold, record("r2")], [outcome("r1", []), outcome("r2", [])])
    by_id = {s.request_id: s for s in result.samples}
    assert by_id["r1"].cold_start == {"b": ("Action", "Comedy"), "y": ("Drama",)}
    assert by_id["r2"].cold_start is None
    assert ServedSample.from_row(by_id["r1"].to_row()) == by_id["r1"]


def test_time_split_holds_out_the_latest_requests() -> None:
    records = [record(f"r{k}", served_at=1_000 + k) for k in range(10)]
    samples = join_served(records, [outcome(f"r{k}", []) for k in range(10)]).samples
    train, valid = time_split(samples[::-1], 0.2)
    assert [s.request_id for s in valid] == ["r8", "r9"] and len(train) == 8
    assert max(s.served_at for s in train) < min(s.served_at for s in valid)
    with pytest.raises(ValueError, match="validation share"):
        time_split(samples, 1.0)
    assert summary(samples)["versions"] == {"v1": 10}
