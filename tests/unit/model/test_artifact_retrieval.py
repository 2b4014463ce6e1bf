"""An artifact's retrieval part: round trip with the index, and a corrupt or mismatched index or
vectors refused with a clear ArtifactError."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load as np_load
from safetensors.numpy import save as np_save

from scoring.model.ann import IndexOptions, build_index, index_bytes
from scoring.model.artifact import CONFIG_FILE, load_artifact, save_artifact, sha256_bytes
from scoring.model.din import DIN, ModelSpec, dense_state
from scoring.model.retrieval import INDEX_FILE, RETRIEVAL_FILE
from streamrank.errors import ArtifactError
from tests.unit.model.test_retrieval import HISTORIES, make_retriever

SPEC = ModelSpec()


def make_artifact(root: Path, *, rows: int = 60) -> Path:
    """A DIN artifact with a retrieval part over the same ``rows`` items."""
    torch.manual_seed(0)
    table = np.random.default_rng(0).normal(size=(rows, SPEC.item_dim)).astype(np.float32)
    _, files = make_retriever(rows)
    return save_artifact(
        root,
        spec=SPEC,
        dense_state=dense_state(DIN(SPEC), torch.randn(4, SPEC.category_dim)),
        item_ids=[f"item-{i}" for i in range(rows)],
        item_table=table,
        oov_row=table.mean(0),
        encoding="int8",
        feature_spec={},
        data={"name": "test", "sha256": "0" * 64},
        metrics={},
        train={"seed": 0},
        retrieval=files,
    )


def replace_file(path: Path, name: str, data: bytes, key: str) -> None:
    """Rewrite one file and record its new sha256 (only the contents are wrong then)."""
    (path / name).write_bytes(data)
    config = json.loads((path / CONFIG_FILE).read_text())
    config["files"][key]["sha256"] = sha256_bytes(data)
    (path / CONFIG_FILE).write_text(json.dumps(config))


def test_round_trip_with_the_index(tmp_path: Path) -> None:
    path = make_artifact(tmp_path)
    config = json.loads((path / CONFIG_FILE).read_text())
    assert set(config["files"]) >= {"retrieval", "index"}
    assert config["retrieval"]["rows"] == 60 and config["retrieval"]["index"]["kind"] == "flat"
    art = load_artifact(path)
    assert art.retrieval is not None
    retriever = art.retriever()
    expected, _ = make_retriever(60)
    assert retriever.item_ids == tuple(art.item_ids)
    np.testing.assert_array_equal(
        retriever.user_vectors(HISTORIES), expected.user_vectors(HISTORIES)
    )
    users = retriever.user_vectors(HISTORIES)
    np.testing.assert_array_equal(retriever.search(users, 5)[0], expected.search(users, 5)[0])


def test_a_flipped_byte_in_the_index_is_caught(tmp_path: Path) -> None:
    path = make_artifact(tmp_path)
    data = bytearray((path / INDEX_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / INDEX_FILE).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"index.faiss is corrupt \(sha256"):
        load_artifact(path)


def test_an_index_that_does_not_load_is_refused(tmp_path: Path) -> None:
    path = make_artifact(tmp_path)
    replace_file(path, INDEX_FILE, (path / INDEX_FILE).read_bytes()[:500], "index")
    with pytest.raises(ArtifactError, match="retrieval index does not load"):
        load_artifact(path)


def test_an_index_of_other_vectors_or_sizes_is_refused(tmp_path: Path) -> None:
    path = make_artifact(tmp_path)
    other = np.random.default_rng(9).normal(size=(60, 16)).astype(np.float32)
    index, _ = build_index(other, IndexOptions())
    replace_file(path, INDEX_FILE, index_bytes(index), "index")
    with pytest.raises(ArtifactError, match="built from another model"):
        load_artifact(path)
    index, _ = build_index(other[:50], IndexOptions())
    replace_file(path, INDEX_FILE, index_bytes(index), "index")
    with pytest.raises(ArtifactError, match="holds 50 vectors of dim 16; the item vectors are 60"):
        load_artifact(path)


def test_nan_vectors_or_other_item_ids_are_refused(tmp_path: Path) -> None:
    path = make_artifact(tmp_path)
    good = (path / RETRIEVAL_FILE).read_bytes()
    tensors = dict(np_load(good))
    tensors["item"] = tensors["item"].copy()
    tensors["item"][3, 0] = np.nan
    replace_file(path, RETRIEVAL_FILE, np_save(tensors), "retrieval")
    with pytest.raises(ArtifactError, match="'item' is not finite float32"):
        load_artifact(path)
    tensors = dict(np_load(good))
    tensors["item_ids"] = np.frombuffer(b"".join(b"x%d\n" % i for i in range(60)), np.uint8)
    replace_file(path, RETRIEVAL_FILE, np_save(tensors), "retrieval")
    with pytest.raises(ArtifactError, match="not the artifact's 60 item ids"):
        load_artifact(path)


def test_an_artifact_without_retrieval_still_loads(tmp_path: Path) -> None:
    from tests.unit.model.test_artifact import make_artifact as plain

    art = load_artifact(plain(tmp_path))
    assert art.retrieval is None
    with pytest.raises(ArtifactError, match="no retrieval model"):
        art.retriever()
