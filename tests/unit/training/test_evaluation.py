"""AUC and GAUC against brute-force pair counting."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.training.evaluation import auc, gauc


def _pairwise(y: np.ndarray, s: np.ndarray) -> float:
    pos, neg = s[y == 1], s[y == 0]
    wins = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    return float(wins.mean())


def test_auc_matches_pair_counting_with_ties() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 500)
    s = rng.integers(0, 20, 500).astype(float)  # many ties
    assert auc(y, s) == pytest.approx(_pairwise(y, s), abs=1e-12)
    assert auc([1, 0], [2.0, 1.0]) == 1.0 and auc([1, 0], [1.0, 2.0]) == 0.0


def test_gauc_weights_users_by_candidates_and_skips_single_label_users() -> None:
    y = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    s = np.array([[4, 3, 2, 1], [1, 2, 3, 4], [1, 2, 3, 4]], dtype=float)
    assert gauc(y, s) == pytest.approx((1.0 + 0.0) / 2)
    rng = np.random.default_rng(1)
    y2 = np.zeros((50, 21))
    y2[:, 0] = 1
    s2 = rng.normal(size=(50, 21))
    expected = np.mean([_pairwise(y2[u], s2[u]) for u in range(50)])
    assert gauc(y2, s2) == pytest.approx(expected)


def test_auc_needs_both_labels() -> None:
    with pytest.raises(ValueError, match="both"):
        auc([1, 1], [0.1, 0.2])
