"""The cascade replay's pure parts: loading the cascade file, the worker's settings from the
recorded cascade, the offline inputs, and the comparison with the replies."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest

from schemas import ClickEvent
from scoring.model.cascade import Widths
from scoring.training.cascade_eval import CascadeConfig
from streamrank.errors import ArtifactError, StreamrankError
from streamrank.settings import Settings
from workbench.cascade_replay import cascade_report, compare_lists, consistent, hit_rate
from workbench.devstack.cascadecases import (
    cascade_config,
    cascade_env,
    item_categories,
    load_cascade_cases,
    offline_inputs,
)
from workbench.devstack.cases import REPLAY_BUDGET_MS, Case
from workbench.replay import Replayed


def _reply(items: list[str], scores: list[float], **kw: Any) -> SimpleNamespace:
    base = {"degraded": False, "reason": None, "cached": False, "model_version": "v1"}
    return SimpleNamespace(items=tuple(items), scores=tuple(scores), **{**base, **kw})


def _case(user: str, items: list[str], positive: str, history: list[tuple[str, int]]) -> Case:
    events = tuple(
        {"event_id": f"{k:08d}", "item_id": i, "category": "c", "ts": ts}
        for k, (i, ts) in enumerate(history)
    )
    return Case(user, tuple(items), tuple(int(i == positive) for i in items), events,
                (0.5,) * len(items), ts=10_000, positive=positive)  # fmt: skip


def test_load_cascade_cases_marks_the_positive_and_limits(tmp_path: Path) -> None:
    path = tmp_path / "cascade_test.jsonl"
    rows = [
        {"user_id": 7, "ts": 5000, "history": [{"event_id": "1", "item_id": "a", "ts": 1000}],
         "attributes": {"age": "24"}, "items": ["b", "c"], "scores": [0.9, 0.8], "positive": "c"},
        {"user_id": 8, "ts": 6000, "history": [], "attributes": {}, "items": ["d"],
         "scores": [0.7], "positive": "z"},
    ]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    cases = load_cascade_cases(path)
    assert [c.user_id for c in cases] == ["7", "8"]
    assert cases[0].labels == (0, 1) and cases[0].positive == "c" and cases[0].ts == 5000
    assert cases[0].file_scores == (0.9, 0.8) and cases[0].attributes == {"age": "24"}
    assert cases[1].labels == (0,)
    assert len(load_cascade_cases(path, limit=1)) == 1
    with pytest.raises(StreamrankError, match="without --no-retrieval"):
        load_cascade_cases(tmp_path / "absent.jsonl")


def test_the_recorded_cascade_becomes_the_workers_settings() -> None:
    cfg = CascadeConfig(Widths(retrieve=300, coarse=40, rerank=20), top_k=7,
                        filter_seen=False, category_cap=2)  # fmt: skip
    assert CascadeConfig.from_json(cfg.to_json()) == cfg
    artifact = SimpleNamespace(
        path="a", config={"retrieval": {"train": {"cascade": cfg.to_json()}}}
    )
    assert cascade_config(artifact) == cfg
    # a scene rule for "default" in the environment would override the recorded rule
    base = Settings().with_env(STREAMRANK_CASCADE_SCENES='{"default": {"category_cap": 9}}',
                               STREAMRANK_CASCADE_HOT_MERGE=50)  # fmt: skip
    c = base.with_env(**cascade_env(cfg)).cascade
    assert (c.retrieve, c.coarse, c.rerank_window, c.top_k) == (300, 40, 20, 7)
    rule = c.rule("default")
    assert (rule.filter_seen, rule.category_cap) == (False, 2)
    assert c.hot_merge == 0 and c.result_cache == "off"
    assert sum(c.budgets_ms().values()) < c.budget_ms == REPLAY_BUDGET_MS


def test_an_artifact_without_the_recorded_cascade_is_refused() -> None:
    with pytest.raises(ArtifactError, match=r"retrieval\.train\.cascade"):
        cascade_config(SimpleNamespace(path="a", config={"retrieval": {"train": {}}}))
    broken = {"retrieval": {"train": {"cascade": {"widths": {"retrieve": 5}}}}}
    with pytest.raises(ArtifactError, match="not a cascade config"):
        cascade_config(SimpleNamespace(path="a", config=broken))


def test_offline_inputs_rebuild_the_histories_and_the_log() -> None:
    artifact = SimpleNamespace(path="a", item_ids=("a", "b", "c", "d"))
    cases = [
        _case("u1", ["d"], "d", [("a", 1000), ("b", 2000), ("c", 3000)]),
        _case("u2", ["a"], "a", []),
    ]
    events = [ClickEvent("1", "u1", "a", 1000, "x|y"), ClickEvent("2", "u1", "b", 2000, None),
              ClickEvent("3", "u2", "c", 4000, "z")]  # fmt: skip
    ds, test = offline_inputs(artifact, cases, events, max_history=2)
    assert test.hist.tolist() == [[1, 2], [0, 0]]  # the newest 2, oldest first
    assert test.hist_mask.tolist() == [[True, True], [False, False]]
    assert test.user.tolist() == ["u1", "u2"] and test.ts.tolist() == [10_000, 10_000]
    assert ds.item_index.tolist() == [0, 1, 2] and ds.ts.tolist() == [1, 2, 4]
    # the category string an event carries is the item's, as the training log's
    assert [ds.item_category(i) for i in range(4)] == ["x|y", "", "z", ""]
    assert item_categories(artifact.item_ids, events) == {"a": "x|y", "c": "z"}
    with pytest.raises(ArtifactError, match=r"not in item_ids\.txt"):
        offline_inputs(artifact, cases, [ClickEvent("9", "u1", "nope", 1, None)], max_history=2)


def test_compare_lists_needs_the_same_order_and_measures_only_equal_lists() -> None:
    expected = ([["a", "b"], ["c", "d"], ["e"], ["f"]], [[0.9, 0.8], [0.7, 0.6], [0.5], [0.4]])
    got = [
        _reply(["a", "b"], [0.90002, 0.8]),
        _reply(["d", "c"], [0.7, 0.6]),  # same set, other order
        None,  # no reply
        _reply(["g"], [0.9]),
    ]
    out = compare_lists(expected, got)
    assert out["same_items"] == 1 and out["same_set"] == 2 and out["mismatched"] == [1, 3]
    assert out["max_abs_diff"] == pytest.approx(2e-5)
    none = compare_lists(expected, [None] * 4)
    assert none["same_items"] == 0 and none["max_abs_diff"] is None
    assert hit_rate([["a", "b"], ["c"]], ["b", "x"]) == 0.5


def _report(replies: list[Any], cases: list[Case], expected: Any) -> dict[str, Any]:
    replayed = Replayed(3, replies, [1.0, 2.0])
    report = cascade_report(cases, replayed, expected, expected, tolerance=1e-4, top_k=2)
    report["consistent"] = consistent(report, cases=len(cases), version="v1")
    return report


def test_the_report_is_consistent_only_when_every_list_matches() -> None:
    cases = [_case("u1", ["a", "b"], "b", []), _case("u2", ["c", "d"], "x", [])]
    expected = ([list(c.items) for c in cases], [[0.9, 0.8], [0.7, 0.6]])
    good = [_reply(["a", "b"], [0.9, 0.80005]), _reply(["c", "d"], [0.7, 0.6])]
    report = _report(good, cases, expected)
    assert report["consistent"], report
    assert report["hr@2"] == {"offline": 0.5, "online": 0.5, "offline_fp32": 0.5}
    assert report["answered"] == 2 and report["mismatches"] == []
    # the fp32 pass against the file: the same lists, but the file's scores are 0.5
    fp32_vs_file = report["offline_fp32_vs_artifact"]
    assert fp32_vs_file["same_items"] == 2 and fp32_vs_file["max_abs_diff"] == pytest.approx(0.4)
    assert report["offline_vs_offline_fp32"] == {"same_items": 2}
    bad = {
        "swapped": [good[0], _reply(["d", "c"], [0.7, 0.6])],
        "far": [good[0], _reply(["c", "d"], [0.7, 0.5])],
        "degraded": [good[0], _reply(["c", "d"], [0.7, 0.6], degraded=True, reason="r")],
        "cached": [good[0], _reply(["c", "d"], [0.7, 0.6], cached=True)],
        "other version": [good[0], _reply(["c", "d"], [0.7, 0.6], model_version="v2")],
        "no reply": [good[0], None],
    }
    for name, replies in bad.items():
        assert not _report(replies, cases, expected)["consistent"], name
    swapped = _report(bad["swapped"], cases, expected)
    assert swapped["mismatches"][0]["user_id"] == "u2" and swapped["same_set"] == 2
    assert np.isclose(_report(bad["far"], cases, expected)["max_abs_diff"], 0.1)
