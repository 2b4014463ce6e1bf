"""``streamrank bench model --compare-dense``: fp32 against int8 dense weights in one run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from scoring.model.artifact import CANDIDATES_FILE, load_artifact
from tests.unit.model.test_artifact import make_artifact
from workbench.cli.main import main
from workbench.devstack.cases import load_cases, offline_scores, quality


def _with_test_users(root: Path) -> Path:
    path = make_artifact(root, rows=30, seed=2)
    rng = np.random.default_rng(0)
    lines = []
    for u in range(12):
        items = [f"item-{i}" for i in rng.choice(30, 6, replace=False)]
        history = [
            {"event_id": f"e{u}-{k}", "item_id": f"item-{rng.integers(30)}", "category": "c",
             "ts": 1000 + k}
            for k in range(int(rng.integers(0, 8)))
        ]  # fmt: skip
        labels = [1, 0, 0, 1, 0, 0] if u % 2 else [0, 1, 0, 0, 0, 0]
        row = {"user_id": u, "items": items, "labels": labels, "history": history,
               "scores": {"din": [0.5] * 6}}  # fmt: skip
        lines.append(orjson.dumps(row) + b"\n")
    (path / CANDIDATES_FILE).write_bytes(b"".join(lines))
    return path


def test_compare_dense_reports_both_timings_and_test_aucs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _with_test_users(tmp_path)
    argv = ["bench", "model", "--compare-dense", "--artifact", str(path), "--candidates", "20",
            "--history", "10", "--batch", "1", "4", "--repeats", "3", "--seconds", "0.01", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert [r["batch_requests"] for r in out["results"]] == [1, 4]
    for r in out["results"]:
        assert r["fp32_ms"] > 0 and r["int8_ms"] > 0 and r["int8_speedup"] > 0
        assert 0 < r["max_abs_prob_diff"] < 0.05  # int8 really differs, and only a little
    # The AUCs are those of an offline scoring of the test users with each option.
    art, cases = load_artifact(path), load_cases(path / CANDIDATES_FILE)
    labels = np.array([c.labels for c in cases])
    for dense in ("fp32", "int8"):
        scores = offline_scores(art, cases, encoding="int8", max_history=50, dense=dense)
        assert out["test"][dense] == quality(labels, scores)
    test = out["test"]
    assert test["users"] == 12 and test["auc_drop"] == round(
        test["fp32"]["auc"] - test["int8"]["auc"], 6
    )
    faster = all(r["int8_speedup"] > 1 for r in out["results"])
    assert out["int8_keeps"] == (faster and test["auc_drop"] <= 0.002)
