"""Training from served samples: a version rescores its own samples to the logged scores,
zero epochs warm-started reproduce the warm-start version, training runs with and without a
warm start (side inputs included), and the artifact records the dataset and its versions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scoring.model.artifact import Artifact, load_artifact
from scoring.model.din import ModelSpec
from scoring.model.features import FAMILIES
from scoring.training.from_dataset import (
    DatasetTrainConfig,
    export_from_dataset,
    train_from_samples,
)
from scoring.training.served_data import DatasetInfo, ServedSample, ranks_by_score
from scoring.training.served_eval import (
    ServedModel,
    evaluate_on_samples,
    ranking_metrics,
    rescore_samples,
)

SPEC = ModelSpec(item_dim=8, id_dim=4, category_dim=4, attention_hidden=(8, 4), mlp_hidden=(8, 4))


def tiny_artifact(out: Path, families: tuple[str, ...]) -> Artifact:
    from scoring.training.export import export_artifact
    from scoring.training.synthetic import generate
    from scoring.training.train import TrainConfig, train_and_evaluate

    ds = generate(
        n_users=60, n_items=300, n_clusters=5, interests=2, events_per_user=(8, 14), seed=5
    )
    cfg = TrainConfig(
        epochs=1, batch_size=128, n_negatives=4, history_len=20, seed=5, spec=SPEC,
        families=families, select="features" if families != ("sequence",) else "best",
        time_split=False, retrieval=None,
    )  # fmt: skip
    result = train_and_evaluate(ds, cfg, progress=False)
    return load_artifact(export_artifact(result, ds, cfg, out, encoding="int8"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    return tiny_artifact(tmp_path_factory.mktemp("plain"), ("sequence",))


@pytest.fixture(scope="module")
def featured(tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    return tiny_artifact(tmp_path_factory.mktemp("featured"), FAMILIES)


def served_samples(artifact: Artifact, n: int = 80, seed: int = 1) -> list[ServedSample]:
    """Requests over the version's items (and a few it never saw), scored by it as served;
    the user clicks the items of the cluster of its latest history event."""
    rng = np.random.default_rng(seed)
    known = list(artifact.item_ids)
    pool = [*known, "new-1", "new-2"]
    spec = artifact.scorer().features
    drafts = []
    for k in range(n):
        hist = [known[i] for i in rng.choice(len(known), size=int(rng.integers(0, 6)))]
        items = [pool[i] for i in rng.choice(len(pool), size=6, replace=False)]
        if k == 0:  # both unknown items are shown at least once
            items = ["new-1", "new-2", *[i for i in items if not i.startswith("new")][:4]]
        labels = tuple(int(rng.random() < 0.3) for _ in items)
        codes = tuple(int(rng.integers(0, n_)) for _, n_ in spec.categorical) or None
        counters = tuple(tuple(int(c) for c in rng.integers(0, 9, 5)) for _ in items)
        drafts.append(ServedSample(
            request_id=f"r{k}", user_id=f"u{k % 7}", model_version=artifact.version,
            ts=1_000 + k, served_at=1_000 + k, history_items=tuple(hist),
            history_ts=tuple(range(len(hist))), history_event_ids=tuple(f"e{j}" for j in range(len(hist))),
            history_actions=(None,) * len(hist), items=tuple(items), ranks=(1,) * len(items),
            labels=labels, scores=(0.0,) * len(items), codes=codes,
            counters=counters if spec.counters else None,
        ))  # fmt: skip
    scores = rescore_samples(ServedModel.from_artifact(artifact), drafts)
    out = []
    for d, s in zip(drafts, scores, strict=True):
        row = {**d.to_row(), "scores": s.tolist(), "ranks": ranks_by_score(s.tolist())}
        out.append(ServedSample.from_row(row))
    return out


def info(samples: list[ServedSample]) -> DatasetInfo:
    return DatasetInfo("data/s.parquet", "ab" * 32, len(samples), (samples[0].model_version,))


def test_batched_rescoring_equals_one_request_at_a_time(featured: Artifact) -> None:
    samples = served_samples(featured, n=12)
    model = ServedModel.from_artifact(featured)
    alone = [rescore_samples(model, [s])[0] for s in samples]
    for a, s in zip(alone, samples, strict=True):
        np.testing.assert_allclose(a, s.scores, atol=1e-6)


@pytest.mark.parametrize("which", ["plain", "featured"])
def test_zero_epochs_warm_started_reproduce_the_version(
    which: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    warm: Artifact = request.getfixturevalue(which)
    samples = served_samples(warm)
    cfg = DatasetTrainConfig(epochs=0, encoding=warm.encoding)
    result = train_from_samples(samples, cfg, warm=warm, progress=False)
    new = load_artifact(export_from_dataset(result, cfg, info(samples), tmp_path))
    assert new.version != warm.version
    assert set(new.item_ids) == set(warm.item_ids) | {"new-1", "new-2"}
    again = rescore_samples(ServedModel.from_artifact(new), samples)
    for got, s in zip(again, samples, strict=True):
        np.testing.assert_allclose(got, s.scores, atol=1e-6)
    before, after = evaluate_on_samples(warm, samples), evaluate_on_samples(new, samples)
    assert {k: before[k] for k in ("auc", "gauc", "hr@10", "n")} == {
        k: after[k] for k in ("auc", "gauc", "hr@10", "n")
    }
    assert new.config["train"]["warm_start"] == warm.version
    assert new.config["data"]["sha256"] == "ab" * 32 and new.config["data"]["rows"] == 80


def test_training_moves_the_weights_and_records_the_dataset(
    featured: Artifact, tmp_path: Path
) -> None:
    samples = served_samples(featured)
    cfg = DatasetTrainConfig(epochs=2, batch_size=64, lr=1e-2, encoding="int8")
    result = train_from_samples(samples, cfg, warm=featured, progress=False)
    path = export_from_dataset(result, cfg, info(samples), tmp_path)
    new = load_artifact(path)
    config = json.loads((path / "config.json").read_text())
    assert config["data"]["served_versions"] == [featured.version]
    assert config["data"]["path"] == "data/s.parquet"
    m = result.metrics
    assert m["samples"]["train"] == 64 and m["samples"]["valid"] == 16 and len(m["epochs"]) == 2
    assert m["valid"]["n"] == 16 and m["valid_warm_start"]["n"] == 16
    assert new.config["feature_spec"]["inputs"] == featured.config["feature_spec"]["inputs"]
    rows = [new.item_ids.index(i) for i in featured.item_ids[:20]]
    assert not np.allclose(new.item_table[rows], featured.item_table[:20])  # trained on


def test_training_without_a_warm_start_uses_the_logged_counters(
    featured: Artifact, tmp_path: Path
) -> None:
    samples = served_samples(featured, n=40)
    cfg = DatasetTrainConfig(epochs=1, batch_size=64, history_len=20, spec=SPEC, encoding="fp32")
    result = train_from_samples(samples, cfg, progress=False)
    assert result.features.families == ("sequence", "counters")
    new = load_artifact(export_from_dataset(result, cfg, info(samples), tmp_path))
    assert new.config["train"]["warm_start"] is None
    report = evaluate_on_samples(new, samples)
    assert report["n"] == 40 and report["skipped"] == 0 and 0.0 <= report["auc"] <= 1.0


def test_a_version_without_the_logged_inputs_skips_those_samples(
    featured: Artifact, plain: Artifact
) -> None:
    samples = served_samples(plain, n=10)  # logged by a sequence-only version: no counters
    report = evaluate_on_samples(featured, samples)
    assert report["n"] == 0 and report["skipped"] == 10
    with pytest.raises(ValueError, match="no training samples"):
        train_from_samples(samples, DatasetTrainConfig(epochs=1), warm=featured, progress=False)


def test_ranking_metrics() -> None:
    labels = [[1, 0, 0], [0, 0], [0, 1] + [0] * 10]
    scores = [[0.9, 0.1, 0.2], [0.3, 0.4], [0.5, 0.0, *[0.6] * 10]]
    m = ranking_metrics(labels, scores)
    assert m["n"] == 3 and m["clicked_requests"] == 2
    assert m["hr@10"] == 0.5  # the second click ranks 12th
    assert m["gauc"] == round((1.0 * 3 + 0.0 * 12) / 15, 5)
    assert ranking_metrics([[0, 0]], [[0.1, 0.2]])["auc"] is None


def test_keep_negatives_keeps_every_click_and_k_negatives_per_click_of_each_request() -> None:
    from scoring.training.from_dataset import keep_negatives

    rows = np.repeat(np.arange(3), 10).astype(np.int64)  # 3 requests x 10 items
    cols = np.tile(np.arange(10), 3).astype(np.int64)
    labels = np.zeros(30, np.float32)
    labels[[2, 11, 15]] = 1  # request 0: one click, request 1: two, request 2: none
    kept_rows, kept_cols = keep_negatives((rows, cols), labels, 3, seed=1)
    kept = labels[kept_rows * 10 + kept_cols]
    assert set(np.flatnonzero(labels)) <= set((kept_rows * 10 + kept_cols).tolist())
    assert np.bincount(kept_rows[kept == 0], minlength=3).tolist() == [3, 6, 0]
    again = keep_negatives((rows, cols), labels, 3, seed=1)
    assert [a.tolist() for a in again] == [kept_rows.tolist(), kept_cols.tolist()]
