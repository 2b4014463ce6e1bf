"""The new-item vector: fitted after training with everything else frozen, deterministically."""

from __future__ import annotations

import numpy as np
import torch

from scoring.training.coldstart_fit import fit_new_item
from scoring.training.data import build_samples
from scoring.training.synthetic import generate
from scoring.training.train import (
    TrainConfig,
    feature_spec_for,
    inputs_for,
    make_ranker,
    model_spec_for,
)


def test_the_fit_is_deterministic_and_changes_only_the_new_vector() -> None:
    ds = generate(n_users=60, n_items=5_000, seed=2)
    cfg = TrainConfig(families=("sequence",), retrieval=None, time_split=False)
    split = build_samples(ds, history_len=cfg.history_len, n_negatives=5, seed=cfg.seed)
    fspec = feature_spec_for(ds, cfg, cfg.families)
    torch.manual_seed(3)
    ranker = make_ranker(ds, model_spec_for(cfg, fspec, "din"), fspec)
    train = inputs_for(ds, split, fspec, cfg, None)["train"]
    before = {k: v.clone() for k, v in ranker.state_dict().items()}
    rng_before = torch.get_rng_state()
    first = fit_new_item(ranker.tower, ranker.net, train, seed=7, samples=2_000)
    second = fit_new_item(ranker.tower, ranker.net, train, seed=7, samples=2_000)
    assert first.shape == (cfg.spec.id_dim,) and first.dtype == np.float32
    np.testing.assert_array_equal(first, second)
    assert not np.allclose(first, ranker.tower.ids.weight.detach().mean(0).numpy())  # it moved
    for name, value in ranker.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert torch.equal(torch.get_rng_state(), rng_before)  # no global random draw
    assert all(p.requires_grad for p in ranker.parameters())
