"""Artifact save/load: round trip, and every corruption is a clear ArtifactError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from scoring.model.artifact import (
    CONFIG_FILE,
    DENSE_FILE,
    ITEMS_FILE,
    load_artifact,
    new_version,
    save_artifact,
)
from scoring.model.din import DIN, ModelSpec, dense_state
from scoring.model.scorer import DinScorer
from streamrank.errors import ArtifactError

SPEC = ModelSpec()


def make_artifact(root: Path, *, rows: int = 30, seed: int = 0, encoding: str = "int8") -> Path:
    torch.manual_seed(seed)
    net = DIN(SPEC)
    table = np.random.default_rng(seed).normal(size=(rows, SPEC.item_dim)).astype(np.float32)
    return save_artifact(
        root,
        spec=SPEC,
        dense_state=dense_state(net, torch.randn(4, SPEC.category_dim)),
        item_ids=[f"item-{i}" for i in range(rows)],
        item_table=table,
        oov_row=table.mean(0),
        encoding=encoding,
        feature_spec={"item": {"table": "item"}},
        data={"name": "test", "sha256": "0" * 64},
        metrics={"test": {"din": {"auc": 0.5}}},
        train={"seed": seed},
    )


def test_roundtrip(tmp_path: Path) -> None:
    path = make_artifact(tmp_path)
    art = load_artifact(path)
    assert art.version == path.name and art.version.startswith("din-")
    assert art.item_ids[:2] == ["item-0", "item-1"] and art.item_table.shape == (30, SPEC.item_dim)
    assert art.encoding == "int8"
    cfg = json.loads((path / CONFIG_FILE).read_text())
    assert cfg["model"]["item_dim"] == SPEC.item_dim and cfg["data"]["sha256"] == "0" * 64
    assert cfg["item_table"] == {"table": "item", "rows": 30, "dim": SPEC.item_dim}
    # the scorer from the artifact scores like one built from the same weights
    h = torch.from_numpy(art.item_table[None, :5])
    c = torch.from_numpy(art.item_table[None, 5:9])
    m, cm = torch.ones(1, 5, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool)
    torch.manual_seed(0)
    expected = DinScorer(DIN(SPEC)).score(h, m, c, cm)
    np.testing.assert_array_equal(load_artifact(path).scorer().score(h, m, c, cm), expected)
    # by version id under an artifacts dir too
    assert load_artifact(art.version, artifacts_dir=tmp_path).version == art.version
    # published config carries the chosen encoding
    assert json.loads(art.config_bytes(encoding="fp16"))["encoding"] == "fp16"


def test_versions_are_unique_and_readable() -> None:
    # 24 random bits: 50 draws collide about once in 13,000 runs (200 did once in 800)
    ids = {new_version("din") for _ in range(50)}
    assert len(ids) == 50
    v = next(iter(ids))
    kind, date, suffix = v.split("-")
    assert kind == "din" and len(date) == 8 and date.isdigit() and len(suffix) == 6


def _corrupt(path: Path, what: str) -> None:
    if what == "missing dense":
        (path / DENSE_FILE).unlink()
    elif what == "missing config":
        (path / CONFIG_FILE).unlink()
    elif what == "flipped byte":
        data = bytearray((path / ITEMS_FILE).read_bytes())
        data[-1] ^= 0xFF
        (path / ITEMS_FILE).write_bytes(bytes(data))
    else:
        cfg = json.loads((path / CONFIG_FILE).read_text())
        if what == "unknown encoding":
            cfg["encoding"] = "int4"
        elif what == "wrong dims":
            cfg["model"]["item_dim"] = 32
            cfg["model"]["id_dim"] = 24
        elif what == "wrong rows":
            cfg["item_table"]["rows"] = 31
        elif what == "bad version":
            cfg["version"] = "din:x"
        elif what == "wrong attention dims":
            cfg["model"]["attention_hidden"] = [32, 16]
        (path / CONFIG_FILE).write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("missing dense", "missing file dense.safetensors"),
        ("missing config", "missing file config.json"),
        ("flipped byte", "items.safetensors is corrupt"),
        ("unknown encoding", "unknown encoding 'int4'"),
        ("wrong dims", "item table dim 24 != model item_dim 32"),
        ("wrong rows", r"config.json says float32\[31, 24\]"),
        ("bad version", "is not a valid id"),
        ("wrong attention dims", "dense weights do not match"),
    ],
)
def test_corrupt_artifacts_name_what_is_wrong(tmp_path: Path, what: str, message: str) -> None:
    path = make_artifact(tmp_path)
    _corrupt(path, what)
    with pytest.raises(ArtifactError, match=message):
        load_artifact(path)


def test_nan_rows_and_duplicate_ids_are_refused(tmp_path: Path) -> None:
    good = make_artifact(tmp_path / "a")
    with pytest.raises(ArtifactError, match="already exists"):
        save_artifact(good.parent, spec=SPEC, dense_state={}, item_ids=[], item_table=np.zeros((0, 24), np.float32),
                      oov_row=np.zeros(24, np.float32), encoding="int8", feature_spec={}, data={}, metrics={},
                      train={}, version=good.name)  # fmt: skip
    torch.manual_seed(0)
    table = np.ones((3, SPEC.item_dim), np.float32)
    table[1, 2] = np.nan
    kwargs = dict(spec=SPEC, dense_state=dense_state(DIN(SPEC)), oov_row=np.zeros(SPEC.item_dim, np.float32),
                  encoding="fp32", feature_spec={}, data={}, metrics={}, train={})  # fmt: skip
    nan_path = save_artifact(tmp_path / "b", item_ids=["x", "y", "z"], item_table=table, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ArtifactError, match="NaN/Inf in rows of ids y"):
        load_artifact(nan_path)
    dup = save_artifact(
        tmp_path / "c", item_ids=["x", "x", "z"], item_table=np.ones_like(table), **kwargs
    )  # type: ignore[arg-type]
    with pytest.raises(ArtifactError, match="duplicate ids"):
        load_artifact(dup)
    nan_oov = save_artifact(
        tmp_path / "e",
        item_ids=["x", "y", "z"],
        item_table=np.ones_like(table),
        **{**kwargs, "oov_row": np.full(SPEC.item_dim, np.inf, np.float32)},
    )  # type: ignore[arg-type]
    with pytest.raises(ArtifactError, match="oov row has NaN/Inf"):
        load_artifact(nan_oov)
    with pytest.raises(ArtifactError, match="unknown encoding 'int3'"):
        save_artifact(
            tmp_path / "d",
            item_ids=["x"],
            item_table=np.ones((1, 24), np.float32),
            **{**kwargs, "encoding": "int3"},
        )  # type: ignore[arg-type]


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no artifact directory"):
        load_artifact(tmp_path / "nope")
    shutil.rmtree(tmp_path)
