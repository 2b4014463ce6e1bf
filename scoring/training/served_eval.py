"""Scoring served samples again with any version, as served, and ranking metrics on them.

A version is rescored with its own weights and its item table after a trip through the store's
encoding (what the embedding store returns), unknown ids taking its OOV row, or the cold-start
vector the version builds from the categories the sample logged for them (as served: the one
definition, :meth:`scoring.model.coldstart.ColdStart.vectors`), and the side inputs
built from the sample's logged raw values through the transforms of
:mod:`scoring.model.features`, the same ones the scoring worker applies. So a sample rescored
with the version that served it reproduces the logged scores, and two versions can be compared
on the same held-out requests (:func:`evaluate_on_samples`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from scoring.embeddings.codec import roundtrip
from scoring.model.artifact import Artifact
from scoring.model.coldstart import ColdStart
from scoring.model.din import DenseWeights
from scoring.model.features import COUNTERS, FeatureSpec, action_codes, dense_counters
from scoring.model.scorer import DinScorer
from scoring.model.side import SideArrays
from scoring.training.evaluation import auc
from scoring.training.served_data import ServedSample, ranks_by_score

IntArray = npt.NDArray[np.int64]


def missing_inputs(spec: FeatureSpec, sample: ServedSample) -> str | None:
    """Why ``sample`` cannot feed a model with ``spec`` (None: it can)."""
    if spec.categorical and (sample.codes is None or len(sample.codes) != len(spec.categorical)):
        return "codes"
    if spec.counters and (sample.counters is None or len(sample.counters) != len(sample.items)):
        return "counters"
    return None


@dataclass(frozen=True)
class Batch:
    """Index form of some samples: rows of an item table (the last row = OOV), masks, side."""

    hist: IntArray  # [B, L]
    hist_mask: npt.NDArray[np.bool_]  # [B, L]
    cand: IntArray  # [B, C]
    cand_mask: npt.NDArray[np.bool_]  # [B, C]
    side: SideArrays | None


def build_batch(
    samples: Sequence[ServedSample], spec: FeatureSpec, row_of: Callable[[str], int]
) -> Batch:
    """The samples as model inputs; ``row_of(item)``: its row in the item table."""
    b = len(samples)
    width_l = max(1, max((len(s.history_items) for s in samples), default=1))
    width_c = max(1, max((len(s.items) for s in samples), default=1))
    hist = np.zeros((b, width_l), dtype=np.int64)
    hist_mask = np.zeros((b, width_l), dtype=bool)
    cand = np.zeros((b, width_c), dtype=np.int64)
    cand_mask = np.zeros((b, width_c), dtype=bool)
    for i, s in enumerate(samples):
        hist[i, : len(s.history_items)] = [row_of(x) for x in s.history_items]
        hist_mask[i, : len(s.history_items)] = True
        cand[i, : len(s.items)] = [row_of(x) for x in s.items]
        cand_mask[i, : len(s.items)] = True
    return Batch(hist, hist_mask, cand, cand_mask, side_inputs(samples, spec, width_c, width_l))


def side_inputs(
    samples: Sequence[ServedSample], spec: FeatureSpec, width: int, hist_width: int
) -> SideArrays | None:
    """``codes [B, P]``, ``dense [B, C, F]`` and ``actions [B, L]`` of the samples' logged raw
    values (the serving transforms: ``dense_counters``, ``action_codes``)."""
    if not spec.categorical and not spec.counters and not spec.actions:
        return None
    b = len(samples)
    codes = dense = actions = None
    for s in samples:
        why = missing_inputs(spec, s)
        if why is not None:
            raise ValueError(
                f"sample {s.request_id!r} (version {s.model_version}) has no logged {why} for "
                "this version's feature spec"
            )
    if spec.categorical:
        codes = np.asarray([s.codes for s in samples], dtype=np.int64).reshape(b, -1)  # [B, P]
    if spec.counters:
        counts = np.zeros((b, width, len(COUNTERS)), dtype=np.int64)  # [B, C, F]
        for i, s in enumerate(samples):
            if s.counters:
                counts[i, : len(s.counters)] = s.counters
        dense = dense_counters(counts)
    if spec.actions:
        actions = np.zeros((b, max(1, hist_width)), dtype=np.int64)  # [B, L]
        for i, s in enumerate(samples):
            found = action_codes(spec, s.history_actions)
            actions[i, : len(found)] = found
    return SideArrays(codes=codes, dense=dense, actions=actions)


@dataclass(frozen=True)
class ServedModel:
    """One version as the scoring worker serves it: scorer, item rows (as stored), OOV row."""

    version: str
    scorer: DinScorer
    rows: Mapping[str, int]  # item id -> row of ``table``
    table: npt.NDArray[np.float32]  # [n + 1, d], the last row the OOV row

    @classmethod
    def from_artifact(
        cls, artifact: Artifact, *, encoding: str | None = None, dense: DenseWeights = "fp32"
    ) -> ServedModel:
        """The version of ``artifact``, its table through ``encoding`` (default: the
        artifact's) and its dense weights served as ``dense``."""
        return cls.from_parts(
            artifact.version, artifact.scorer(dense=dense), artifact.item_ids,
            artifact.item_table, artifact.oov_row, encoding or artifact.encoding,
        )  # fmt: skip

    @classmethod
    def from_parts(
        cls, version: str, scorer: DinScorer, item_ids: Sequence[str],
        table: npt.NDArray[np.float32], oov: npt.NDArray[np.float32], encoding: str,
    ) -> ServedModel:  # fmt: skip
        stacked = np.vstack([np.asarray(table, np.float32), np.asarray(oov, np.float32)[None]])
        rows = {item: r for r, item in enumerate(item_ids)}
        return cls(version, scorer, rows, roundtrip(stacked, encoding))

    def row_of(self, item: str) -> int:
        return self.rows.get(item, len(self.table) - 1)

    @property
    def cold(self) -> ColdStart | None:
        """The version's cold-start parts (None: unknown items keep the OOV row)."""
        return self.scorer.cold_start


def cold_rows(
    model: ServedModel, sample: ServedSample, memo: dict[tuple[str, ...], Any] | None = None
) -> dict[str, npt.NDArray[np.float32]]:
    """The vectors of the sample's items that ``model`` does not know and that were served
    cold: built by the version's own cold-start parts from the logged categories (those in its
    vocabulary; none left, or no parts: the OOV row, as serving does). ``memo``: vectors by
    categories, shared across samples."""
    cold = model.cold
    if cold is None or not sample.cold_start:
        return {}
    memo = {} if memo is None else memo
    out: dict[str, npt.NDArray[np.float32]] = {}
    for item, logged in sample.cold_start.items():
        names = cold.used(logged)
        if item in model.rows or not names:
            continue
        key = tuple(names)
        if key not in memo:
            memo[key] = cold.vectors([names])[0]
        out[item] = memo[key]
    return out


def _put_cold(
    rows: npt.NDArray[np.float32], ids: Sequence[str], vectors: Mapping[str, Any]
) -> None:
    """Replace, in place, the rows (aligned with ``ids``) of the items in ``vectors``."""
    for k, item in enumerate(ids):
        if item in vectors:
            rows[k] = vectors[item]


def rescore_samples(
    model: ServedModel, samples: Sequence[ServedSample], *, batch_size: int = 64
) -> list[npt.NDArray[np.float32]]:
    """Each sample's items scored by ``model`` (probabilities, aligned with ``items``); items it
    does not know that were served cold get their cold vectors (:func:`cold_rows`)."""
    out: list[npt.NDArray[np.float32]] = []
    memo: dict[tuple[str, ...], Any] = {}
    for start in range(0, len(samples), batch_size):
        part = samples[start : start + batch_size]
        batch = build_batch(part, model.scorer.features, model.row_of)
        hist = model.table[batch.hist] * batch.hist_mask[..., None]  # [B, L, d]
        cands = model.table[batch.cand] * batch.cand_mask[..., None]  # [B, C, d]
        for i, s in enumerate(part):
            vectors = cold_rows(model, s, memo)
            if vectors:
                _put_cold(hist[i], s.history_items, vectors)
                _put_cold(cands[i], s.items, vectors)
        probs = model.scorer.score(hist, batch.hist_mask, cands, batch.cand_mask, batch.side)
        out.extend(probs[i, : len(s.items)].astype(np.float32) for i, s in enumerate(part))
    return out


def _request_auc(labels: npt.NDArray[Any], scores: npt.NDArray[Any]) -> float | None:
    if labels.min(initial=1) == labels.max(initial=0):
        return None
    return auc(labels, scores)


def ranking_metrics(
    labels: Sequence[Sequence[int]], scores: Sequence[npt.ArrayLike], *, k: int = 10
) -> dict[str, Any]:
    """AUC pooled over impressions, GAUC (per-request AUC weighted by the request's items,
    requests with a click and a non-click), HR@k (requests with a click among the top k, of the
    requests with a click; ties in served order) and n (requests); None where undefined."""
    ys = [np.asarray(y, dtype=np.float64) for y in labels]
    ss = [np.asarray(s, dtype=np.float64) for s in scores]
    flat_y = np.concatenate(ys) if ys else np.zeros(0)
    pooled = _request_auc(flat_y, np.concatenate(ss)) if ys else None
    weighted = weights = 0.0
    hits = clicked = 0
    for y, s in zip(ys, ss, strict=True):
        per = _request_auc(y, s)
        if per is not None:
            weighted += per * len(y)
            weights += len(y)
        if y.max(initial=0) > 0:
            clicked += 1
            ranks = np.asarray(ranks_by_score(s.tolist()))
            hits += int(bool((ranks[y > 0] <= k).any()))
    return {
        "auc": None if pooled is None else round(pooled, 5),
        "gauc": round(weighted / weights, 5) if weights else None,
        f"hr@{k}": round(hits / clicked, 5) if clicked else None,
        "n": len(ys),
        "clicked_requests": clicked,
    }


def evaluate_on_samples(
    model: Artifact | ServedModel, samples: Sequence[ServedSample]
) -> dict[str, Any]:
    """``{"auc", "gauc", "hr@10", "n", ...}`` of ``model`` (an artifact, served with its own
    encoding, or a :class:`ServedModel`) on ``samples``, rescored as served. Samples that lack
    an input the version needs are left out and counted (``skipped``)."""
    served = model if isinstance(model, ServedModel) else ServedModel.from_artifact(model)
    spec = served.scorer.features
    usable = [s for s in samples if missing_inputs(spec, s) is None]
    scores = rescore_samples(served, usable)
    report = ranking_metrics([s.labels for s in usable], scores)
    return {**report, "version": served.version, "skipped": len(samples) - len(usable)}
