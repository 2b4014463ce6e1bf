"""A small DIN good enough to tell from a broken one: synthetic clicks with planted interests,
300 users, a few epochs (about 10 s on a CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def rollout_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from scoring.model.din import ModelSpec
    from scoring.training.export import export_artifact
    from scoring.training.synthetic import generate
    from scoring.training.train import TrainConfig, train_and_evaluate

    ds = generate(
        n_users=300, n_items=300, n_clusters=5, interests=2, events_per_user=(10, 20), seed=3
    )
    spec = ModelSpec(
        item_dim=16, id_dim=8, category_dim=8, attention_hidden=(16, 8), mlp_hidden=(16, 8)
    )
    cfg = TrainConfig(
        epochs=4, batch_size=128, n_negatives=9, history_len=20, seed=3, spec=spec,
        families=("sequence",), time_split=False,  # only the served model is needed
    )  # fmt: skip
    result = train_and_evaluate(ds, cfg, progress=False)
    assert result.metrics["test"]["din"]["auc"] > 0.8, result.metrics["test"]
    out = tmp_path_factory.mktemp("rollout-model")
    return Path(export_artifact(result, ds, cfg, out, encoding="int8"))


@pytest.fixture
def own_version(tiny_artifacts: tuple[Path, Path], unique: str, tmp_path: Path) -> Path:
    """The first tiny DIN under a version name of this test's own: online statistics are kept
    per version, so a test that serves it leaves nothing in another test's windows."""
    from scoring.model.artifact import derive_artifact, load_artifact

    artifact = load_artifact(tiny_artifacts[0])
    return Path(derive_artifact(artifact, tmp_path / "own", version=f"din-own-{unique}",
                                item_table=artifact.item_table, note="a test's own copy"))  # fmt: skip
