"""Full-ranking evaluation over ALL items: retrieval, the towers' dot product, DIN, popularity
and the whole cascade, on a protocol's test users.

For every method the items of the user's history window (the events the sample's history
holds: the last ``history_len`` before the sample time) are excluded, as the cascade's filter
stage does online. Reported: HR@10, NDCG@10 and recall@200 of the held-out positive. Ties are
broken by item row (a stable sort by score), as everywhere in the cascade.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from scoring.model.din import DIN
from scoring.model.features import FeatureSpec
from scoring.model.retrieval import RetrievalFiles, Retriever
from scoring.model.scorer import DinScorer
from scoring.training.cascade_eval import CascadeConfig, CascadeResult, run_cascade
from scoring.training.data import Dataset, Samples, Split
from scoring.training.pointintime import LogIndex, side_values
from scoring.training.twotower import RetrievalConfig, train_retriever
from streams.windows import Window

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]
RECALL_AT = 200
HIT_AT = 10


@dataclass(frozen=True)
class DinModel:
    """What DIN brute force needs: the serving scorer, its item table and feature spec."""

    scorer: DinScorer
    table: FloatArray  # [N, d]
    features: FeatureSpec
    windows: dict[str, Window]
    index: LogIndex | None


def din_model(net: DIN, table: FloatArray, features: FeatureSpec, windows: dict[str, Window],
              index: LogIndex | None) -> DinModel:  # fmt: skip
    return DinModel(DinScorer(net), table, features, windows, index)


def histories(ds: Dataset, test: Samples) -> list[list[str]]:
    """Each test user's history as raw item ids, oldest first."""
    return [
        [ds.items[i] for i in test.hist[u][test.hist_mask[u]].tolist()] for u in range(len(test))
    ]


def seen_mask(test: Samples, n_items: int) -> npt.NDArray[np.bool_]:
    """``[U, N]``: True for the items in each user's history window."""
    seen = np.zeros((len(test), n_items), dtype=bool)
    users = np.repeat(np.arange(len(test)), test.hist.shape[1])
    seen[users, test.hist.reshape(-1)] = test.hist_mask.reshape(-1)
    return seen


def top_rows(scores: FloatArray, k: int) -> IntArray:
    """The ``k`` best rows per user ``[U, k]`` (by score, ties by row; -inf rows never; -1
    padded)."""
    out = np.full((scores.shape[0], k), -1, dtype=np.int64)
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < scores.shape[1] else None
    for u in range(scores.shape[0]):
        cands = part[u] if part is not None else np.arange(scores.shape[1])
        # the partition may cut a tie at the k-th score: take every row tied with it
        kth = scores[u, cands].min()
        cands = np.union1d(cands, np.flatnonzero(scores[u] == kth))
        cands = cands[np.isfinite(scores[u, cands])]
        order = cands[np.lexsort((cands, -scores[u, cands].astype(np.float64)))][:k]
        out[u, : len(order)] = order
    return out


def ranking_metrics(lists: IntArray, positive: IntArray) -> dict[str, float]:
    """HR@10, NDCG@10 and recall@200 of the positive in each user's list ``[U, K]``."""
    hit = lists == positive[:, None]  # [U, K]
    found = hit.any(axis=1)
    rank = np.where(found, hit.argmax(axis=1), np.iinfo(np.int64).max)  # [U] 0-based
    ndcg = np.where(rank < HIT_AT, 1.0 / np.log2(np.minimum(rank, HIT_AT) + 2.0), 0.0)
    return {
        "hr@10": round(float((rank < HIT_AT).mean()), 5),
        "ndcg@10": round(float(ndcg.mean()), 5),
        "recall@200": round(float((rank < RECALL_AT).mean()), 5),
    }


def retrieval_lists(
    retriever: Retriever, users: FloatArray, seen: npt.NDArray[np.bool_]
) -> IntArray:
    """The ANN's best rows after the seen filter ``[U, 200]`` (-1 padded)."""
    width = RECALL_AT + int(seen.sum(axis=1).max(initial=0))
    rows, _ = retriever.search(users, width)  # [U, W]
    drop = (rows < 0) | np.take_along_axis(seen, np.maximum(rows, 0), axis=1)  # [U, W]
    out = np.full((len(rows), RECALL_AT), -1, dtype=np.int64)
    for u in range(len(rows)):
        kept = rows[u][~drop[u]][:RECALL_AT]
        out[u, : len(kept)] = kept
    return out


def sample_rows(samples: Samples, rows: slice) -> Samples:
    """The samples ``rows`` of ``samples``."""
    return Samples(*(getattr(samples, f)[rows] for f in Samples.__dataclass_fields__))


def din_scores(
    ds: Dataset, test: Samples, din: DinModel, rows: IntArray, valid: npt.NDArray[np.bool_]
) -> FloatArray:
    """DIN probabilities ``[U, C]`` of candidate rows ``[U, C]`` (``valid`` marks real ones)
    through the serving scorer, with the side inputs as of each sample's time."""
    cands = np.where(valid, rows, 0)  # [U, C]
    samples = replace(test, cand=cands, label=np.zeros(cands.shape, dtype=np.float32))
    side, _ = side_values(ds, samples, din.features, windows=din.windows, index=din.index)
    width = max(int(test.hist_mask.sum(1).max(initial=0)), 1)
    hist = din.table[test.hist[:, :width]]  # [U, L', d]
    return din.scorer.score(hist, test.hist_mask[:, :width], din.table[cands], valid, side)


def din_all_items(
    ds: Dataset, test: Samples, din: DinModel, seen: npt.NDArray[np.bool_], *, progress: bool
) -> IntArray:
    """DIN brute force: every item scored for every user, the best 200 unseen ``[U, 200]``."""
    n_items = len(ds.items)
    out = np.full((len(test), RECALL_AT), -1, dtype=np.int64)
    chunk = max(1, 200_000 // max(n_items, 1))
    everything = np.broadcast_to(np.arange(n_items), (chunk, n_items))
    for s in tqdm(range(0, len(test), chunk), desc="din all items", unit="chunk",
                  disable=not progress):  # fmt: skip
        part = slice(s, min(s + chunk, len(test)))
        b = part.stop - part.start
        scores = din_scores(
            ds, sample_rows(test, part), din, everything[:b], np.ones((b, n_items), bool)
        )
        scores = np.where(seen[part], np.float32(-np.inf), scores)
        out[part] = top_rows(scores, RECALL_AT)
    return out


def din_cascade(
    ds: Dataset,
    test: Samples,
    retriever: Retriever,
    users: FloatArray,
    din: DinModel,
    cascade: CascadeConfig,
    *,
    width: int,
    progress: bool = False,
) -> CascadeResult:
    """The whole cascade for the test users (``users [U, D]``: their vectors) with ``din`` on
    the survivors: what ``streamrank train`` evaluates, and what a replay reproduces online
    with the item table as published."""
    scored = lambda rows, valid, part: din_scores(ds, sample_rows(test, part), din, rows, valid)  # noqa: E731
    history = histories(ds, test)
    return run_cascade(
        ds, test, retriever, users, history, scored, cascade, width=width, progress=progress
    )


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, round(time.perf_counter() - started, 2)


def full_ranking(
    ds: Dataset,
    test: Samples,
    item_counts: IntArray,
    *,
    retriever: Retriever,
    din: DinModel,
    cascade: CascadeConfig,
    progress: bool = False,
) -> tuple[dict[str, Any], CascadeResult]:
    """HR@10, NDCG@10 and recall@200 over all items for retrieval (ANN), the towers' exact dot
    product, DIN brute force, popularity and the whole cascade, with each method's seconds."""
    n_items = len(ds.items)
    positive = test.cand[:, 0]
    seen = seen_mask(test, n_items)  # [U, N]
    history = histories(ds, test)
    users, user_s = _timed(lambda: retriever.user_vectors(history))
    masked = lambda s: np.where(seen, np.float32(-np.inf), s)  # noqa: E731
    ann, ann_s = _timed(lambda: retrieval_lists(retriever, users, seen))
    dot, dot_s = _timed(lambda: top_rows(masked(users @ retriever.vectors.T), RECALL_AT))
    pop = np.broadcast_to(item_counts.astype(np.float32), (len(test), n_items))
    popular, pop_s = _timed(lambda: top_rows(masked(pop), RECALL_AT))
    brute, din_s = _timed(lambda: din_all_items(ds, test, din, seen, progress=progress))
    whole, cascade_s = _timed(
        lambda: din_cascade(
            ds, test, retriever, users, din, cascade, width=RECALL_AT, progress=progress
        )
    )
    report = {
        "users": len(test),
        "items": n_items,
        "retrieval": {**ranking_metrics(ann, positive), "seconds": round(user_s + ann_s, 2)},
        "dot": {**ranking_metrics(dot, positive), "seconds": round(user_s + dot_s, 2)},
        "din": {**ranking_metrics(brute, positive), "seconds": din_s},
        "popularity": {**ranking_metrics(popular, positive), "seconds": pop_s},
        "cascade": {
            **ranking_metrics(whole.order, positive),
            "seconds": round(user_s + cascade_s, 2),
            **cascade.to_json(),
        },
    }
    return report, whole


@dataclass
class RetrievalRun:
    """A protocol's retrieval model, its artifact part and the full-ranking report."""

    retriever: Retriever
    files: RetrievalFiles
    report: dict[str, Any]
    cascade: CascadeResult  # the offline cascade's reply per test user


TrainedRetriever = tuple[Retriever, RetrievalFiles, dict[str, Any]]


def run_protocol(
    ds: Dataset, split: Split, din: DinModel, cfg: RetrievalConfig, *, seed: int, progress: bool,
    towers: TrainedRetriever | None = None,
) -> RetrievalRun:  # fmt: skip
    """Train the two towers on the split's train samples (unless ``towers`` holds them already),
    build their index, and rank all items for its test users with every method."""
    retriever, files, trained = towers or train_retriever(
        ds, split.train, split.train_item_counts, cfg, seed=seed, progress=progress
    )
    figures, cascade = full_ranking(ds, split.test, split.train_item_counts, retriever=retriever,
                                    din=din, cascade=cfg.cascade, progress=progress)  # fmt: skip
    return RetrievalRun(retriever, files, {**figures, "retrieval_model": trained}, cascade)


def cascade_goals(full_ranking: dict[str, dict[str, Any] | None]) -> dict[str, bool]:
    """Per protocol: the cascade's HR@10 within 2% (relative) of DIN brute force over all
    items, and at least 1.25x popularity's."""
    out: dict[str, bool] = {}
    for protocol, report in full_ranking.items():
        if not report:
            continue
        hr = {name: report[name]["hr@10"] for name in ("cascade", "din", "popularity")}
        out[f"cascade_hr10_within_2pct_of_din_{protocol}"] = hr["cascade"] >= 0.98 * hr["din"]
        out[f"cascade_hr10_1.25x_popularity_{protocol}"] = hr["cascade"] >= 1.25 * hr["popularity"]
    return out
