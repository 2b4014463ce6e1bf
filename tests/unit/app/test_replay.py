"""The replay's pure parts: test-candidate loading, expected sequences, offline expectation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from scoring.embeddings.codec import roundtrip
from scoring.model.artifact import load_artifact
from streamrank.errors import StreamrankError
from tests.unit.model.test_artifact import make_artifact
from workbench.devstack.cases import (
    Case,
    click_events,
    expected_sequences,
    load_cases,
    offline_scores,
)
from workbench.replay import differences


def _case(user: str, history: list[tuple[str, str, int]], items: list[str]) -> Case:
    events = tuple({"event_id": e, "item_id": i, "category": "c", "ts": t} for e, i, t in history)
    return Case(user, tuple(items), (1,) + (0,) * (len(items) - 1), events, (0.5,) * len(items))


def test_load_cases_limits_and_refuses_ragged_lists(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    rows = [
        {"user_id": 7, "items": ["a", "b"], "labels": [1, 0], "history": [],
         "scores": {"din": [0.6, 0.4]}},
        {"user_id": "8", "items": ["c", "d"], "labels": [0, 1], "history": [],
         "scores": {"din": [0.1, 0.9]}},
    ]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    cases = load_cases(path, limit=1)
    assert [c.user_id for c in cases] == ["7"] and cases[0].file_scores == (0.6, 0.4)
    rows[1]["items"] = ["c"]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    with pytest.raises(StreamrankError, match="different candidate counts"):
        load_cases(path)
    with pytest.raises(StreamrankError, match="missing"):
        load_cases(tmp_path / "absent.jsonl")


def test_expected_sequences_follow_ts_then_event_id_and_the_cap() -> None:
    case = _case("u", [("00000009", "x", 5), ("00000010", "y", 5), ("00000002", "z", 9),
                       ("00000001", "w", 1)], ["a"])  # fmt: skip
    got = expected_sequences([case], run="r1", length=3)
    assert got == {"r1-u": ["r1-00000009", "r1-00000010", "r1-00000002"]}
    events = click_events([case], run="r1")
    assert [(e.user_id, e.event_id, e.ts) for e in events][:2] == [
        ("r1-u", "r1-00000009", 5),
        ("r1-u", "r1-00000010", 5),
    ]


def test_offline_scores_use_the_encoded_table_and_padding_changes_nothing(tmp_path: Path) -> None:
    artifact = load_artifact(make_artifact(tmp_path, rows=40))
    ids = artifact.item_ids
    cases = [
        _case("u1", [(f"{k:08d}", ids[k], k) for k in range(7)], ids[10:14]),
        _case("u2", [], ids[20:24]),  # cold start: empty history
        _case(
            "u3",
            [("00000001", ids[3], 1), ("00000002", "never-seen", 2)],
            [ids[5], "unknown", ids[6], ids[7]],
        ),
    ]
    batched = offline_scores(artifact, cases, encoding="int8", max_history=5)
    singles = np.vstack(
        [offline_scores(artifact, [c], encoding="int8", max_history=5) for c in cases]
    )
    np.testing.assert_allclose(batched, singles, atol=1e-6)
    # the same by hand for u1: newest 5 events, int8 round-tripped rows
    table = roundtrip(artifact.item_table, "int8")
    hist = table[[2, 3, 4, 5, 6]][None]
    cands = table[10:14][None]
    want = artifact.scorer().score(hist, np.ones((1, 5), bool), cands, np.ones((1, 4), bool))
    np.testing.assert_allclose(batched[0], want[0], atol=1e-6)
    # unknown ids take the (encoded) OOV row
    oov = roundtrip(artifact.oov_row[None], "int8")
    hist3 = np.vstack([table[3], oov[0]])[None]
    cands3 = np.vstack([table[5], oov[0], table[6], table[7]])[None]
    want3 = artifact.scorer().score(hist3, np.ones((1, 2), bool), cands3, np.ones((1, 4), bool))
    np.testing.assert_allclose(batched[2], want3[0], atol=1e-6)
    assert not np.allclose(
        batched, offline_scores(artifact, cases, encoding="fp32", max_history=5), atol=1e-7
    )


def test_differences() -> None:
    d = differences([[0.5, 0.25]], [[0.5, 0.75]])
    assert d["max_abs_diff"] == 0.5 and d["mean_abs_diff"] == 0.25
