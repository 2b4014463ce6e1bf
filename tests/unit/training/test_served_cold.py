"""Cold-start items in served samples: the join keeps the record's cold-start map, a sample
rescored with its version gives a cold item the vector serving built (not the OOV row), a
version without cold-start parts keeps the OOV row, and ``train --from-dataset`` starts a
cold item at its cold vector and ships the warm-start version's cold-start parts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scoring.model.artifact import Artifact, load_artifact
from scoring.serving.served_log import rescore
from scoring.training.from_dataset import (
    DatasetTrainConfig,
    export_from_dataset,
    train_from_samples,
)
from scoring.training.served_data import ServedSample, join_served
from scoring.training.served_eval import ServedModel, rescore_samples
from tests.unit.training.test_from_dataset import info, served_samples, tiny_artifact


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    artifact = tiny_artifact(tmp_path_factory.mktemp("cold"), ("sequence",))
    assert artifact.scorer().cold_start is not None
    return artifact


class Store:
    """The embedding store of one served version: its rows as stored, the OOV row for ids
    it does not know (what ``EmbeddingSource.lookup`` returns)."""

    def __init__(self, model: ServedModel) -> None:
        self.model = model

    async def lookup(self, version: str, table: str, ids: Sequence[str]) -> np.ndarray:
        return self.model.table[[self.model.row_of(i) for i in ids]]


def cold_record(warm: Artifact, model: ServedModel) -> dict[str, Any]:
    """A served-log record with an unknown item shown and one in the history, both served
    cold; its scores computed by the serving code path (``served_log.rescore``)."""
    cold = model.cold
    assert cold is not None
    names = list(cold.vocabulary)
    known = list(warm.item_ids)
    record: dict[str, Any] = {
        "request_id": "r-cold", "user_id": "u1", "model_version": warm.version,
        "items": [known[3], "fresh-1", known[7], "fresh-2"], "scores": [0.0] * 4,
        "served_at": 1_000, "degraded": False,
        "sequence": {"item_ids": [known[1], "fresh-3"], "ts": [1, 2], "event_ids": ["e1", "e2"],
                     "actions": [None, None]},
        "cold_start": {"fresh-1": names[:2], "fresh-2": names[2:3], "fresh-3": names[1:3]},
    }  # fmt: skip
    scores = asyncio.run(rescore(record, scorer=model.scorer, embeddings=Store(model)))
    return {**record, "scores": scores.tolist()}


def joined(record: dict[str, Any]) -> ServedSample:
    outcome = {"request_id": record["request_id"], "items": record["items"], "clicked": []}
    (sample,) = join_served([record], [outcome]).samples
    return sample


def test_a_cold_item_rescores_to_its_served_score(warm: Artifact) -> None:
    model = ServedModel.from_artifact(warm)
    sample = joined(cold_record(warm, model))
    assert sample.cold_start == {
        k: tuple(v) for k, v in cold_record(warm, model)["cold_start"].items()
    }
    (got,) = rescore_samples(model, [sample])
    np.testing.assert_allclose(got, sample.scores, atol=1e-6)
    (oov,) = rescore_samples(model, [replace(sample, cold_start=None)])
    assert np.abs(oov - np.asarray(sample.scores)).max() > 1e-4  # the cold vectors matter


def test_a_version_without_cold_start_parts_keeps_the_oov_row(warm: Artifact) -> None:
    model = ServedModel.from_artifact(warm)
    sample = joined(cold_record(warm, model))
    model.scorer.cold_start = None
    (got,) = rescore_samples(model, [sample])
    (oov,) = rescore_samples(model, [replace(sample, cold_start=None)])
    np.testing.assert_allclose(got, oov, atol=0)


def test_categories_outside_the_vocabulary_keep_the_oov_row(warm: Artifact) -> None:
    model = ServedModel.from_artifact(warm)
    sample = joined(cold_record(warm, model))
    unknown = replace(sample, cold_start={i: ("not-a-category",) for i in sample.cold_start or {}})
    (got,) = rescore_samples(model, [unknown])
    (oov,) = rescore_samples(model, [replace(sample, cold_start=None)])
    np.testing.assert_allclose(got, oov, atol=0)


def test_zero_epochs_start_cold_items_cold_and_ship_the_cold_start_parts(
    warm: Artifact, tmp_path: Path
) -> None:
    model = ServedModel.from_artifact(warm)
    cold_sample = joined(cold_record(warm, model))
    samples = [*served_samples(warm, n=40), replace(cold_sample, served_at=5_000)]
    cfg = DatasetTrainConfig(epochs=0, encoding=warm.encoding, valid_share=0.0)
    result = train_from_samples(samples, cfg, warm=warm, progress=False)
    new = load_artifact(export_from_dataset(result, cfg, info(samples), tmp_path))
    cold, shipped = model.cold, new.scorer().cold_start
    assert cold is not None and shipped is not None
    np.testing.assert_array_equal(shipped.new_item, cold.new_item)
    np.testing.assert_array_equal(shipped.categories, cold.categories)
    assert dict(shipped.vocabulary) == dict(cold.vocabulary)
    row = {item: r for r, item in enumerate(new.item_ids)}
    for item, names in (cold_sample.cold_start or {}).items():
        np.testing.assert_array_equal(new.item_table[row[item]], cold.vectors([names])[0])
    (got,) = rescore_samples(ServedModel.from_artifact(new), [cold_sample])
    # the cold rows are now the new version's own, stored in its encoding (int8): within it
    np.testing.assert_allclose(got, cold_sample.scores, atol=1e-4)


def test_without_a_warm_start_no_cold_start_parts_ship(warm: Artifact, tmp_path: Path) -> None:
    samples = served_samples(warm, n=20)
    cfg = DatasetTrainConfig(epochs=1, encoding="fp32", valid_share=0.0)
    result = train_from_samples(samples, cfg, progress=False)
    new = load_artifact(export_from_dataset(result, cfg, info(samples), tmp_path))
    assert new.scorer().cold_start is None
