"""Ranking metrics: AUC (ties count one half) and GAUC (per-user AUC weighted by candidates)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def _average_ranks(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """1-based ranks, ties get their average rank (like scipy's rankdata 'average')."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    new_value = np.r_[True, ordered[1:] != ordered[:-1]]
    dense = np.cumsum(new_value)  # group id of each sorted position, 1-based
    bounds = np.r_[np.flatnonzero(new_value), len(values)]  # group start positions, then n
    avg = 0.5 * (bounds[dense - 1] + 1 + bounds[dense])  # mean of the group's 1-based ranks
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = avg
    return ranks


def auc(labels: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Area under the ROC curve of binary ``labels`` given ``scores`` (flattened)."""
    y = np.asarray(labels).reshape(-1) > 0.5
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both positive and negative labels")
    ranks = _average_ranks(s)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def gauc(labels: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Per-user AUC weighted by the user's candidate count; rows = users, ``[U, C]``.

    Users whose candidates are all one label are skipped (their AUC is undefined).
    """
    y = np.asarray(labels) > 0.5  # [U, C]
    s = np.asarray(scores, dtype=np.float64)  # [U, C]
    pairs = y[:, :, None] & ~y[:, None, :]  # [U, C, C]: (positive i, negative j)
    wins = (s[:, :, None] > s[:, None, :]) + 0.5 * (s[:, :, None] == s[:, None, :])  # [U, C, C]
    n_pairs = pairs.sum(axis=(1, 2))  # [U]
    ok = n_pairs > 0
    if not ok.any():
        raise ValueError("GAUC needs at least one user with both labels")
    per_user = (wins * pairs).sum(axis=(1, 2))[ok] / n_pairs[ok]  # [U']
    weights = np.full(y.shape, True).sum(axis=1)[ok].astype(np.float64)  # candidates per user
    return float((per_user * weights).sum() / weights.sum())
