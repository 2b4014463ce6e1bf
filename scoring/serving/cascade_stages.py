"""The cascade's stages as functions of their inputs (no I/O, no clock): retrieval through the
version's :class:`~scoring.serving.protocols.Retriever`, the coarse dot-product cut and the
rerank. The candidate transforms themselves are :mod:`scoring.model.cascade`'s, shared with
the offline evaluation; the orchestration (budgets, fallbacks, the deep model) is
:mod:`scoring.serving.pipeline`."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from scoring.model.cascade import Scores, best, merge_candidates, rerank
from scoring.serving import replies
from scoring.serving.protocols import Retriever


class NoHotItems:
    """An empty hot-item pool: the fallback has nothing to offer until a pool is wired in."""

    def items(self) -> tuple[str, ...]:
        return ()


def user_vectors(retriever: Retriever, histories: Sequence[Sequence[str]]) -> np.ndarray:
    """``[B, D]`` float32 user vectors of histories of raw ids, oldest first."""
    return np.asarray(retriever.user_vectors(histories), dtype=np.float32)


def search(
    retriever: Retriever, users: np.ndarray, n: int, *, end: float = float("inf")
) -> list[list[str] | None]:
    """Each user's ``n`` nearest items, best first, as raw ids (padding dropped), one user at a
    time while the last search's time still fits before ``end`` (a ``time.perf_counter``
    value): the users not reached get None (each falls back on its own, and a late stage stops
    using the CPU)."""
    ids = retriever.item_ids
    out: list[list[str] | None] = [None] * len(users)
    took = 0.0
    for b in range(len(users)):
        started = time.perf_counter()
        if started + took >= end:
            break
        rows, _scores = retriever.search(users[b : b + 1], n)  # [1, n]
        out[b] = [ids[r] for r in np.asarray(rows)[0].tolist() if r >= 0]
        took = time.perf_counter() - started
    return out


def with_hot(
    found: Sequence[str], hot: Sequence[str], *, retrieve: int, hot_merge: int
) -> list[str]:
    """The index's candidates, then the first ``hot_merge`` hot items, each id once."""
    return merge_candidates([found, hot[:hot_merge]], limit=retrieve + hot_merge)


def finite(scores: np.ndarray) -> Scores:
    """Scores with every non-finite value (an id the retriever does not know scores -inf)
    below the lowest finite one, so a reply never carries one and the order holds."""
    values = np.asarray(scores, dtype=np.float32)
    ok = np.isfinite(values)
    if ok.all():
        return values
    floor = float(values[ok].min()) - 1.0 if ok.any() else 0.0
    return np.where(ok, values, np.float32(floor)).astype(np.float32)


def coarse_cut(
    retriever: Retriever | None,
    users: np.ndarray | None,
    candidates: Sequence[Sequence[str]],
    width: int,
) -> list[tuple[list[str], Scores]]:
    """Each request's best ``width`` candidates by the dot product of its user vector
    (``users [B, D]``) with theirs; without a retriever or user vectors, the first ``width``
    in candidate order with neutral scores."""
    if retriever is None or users is None:
        return [best(c, replies.neutral_scores(len(c)), width) for c in candidates]
    widest = max((len(c) for c in candidates), default=0)
    rows = np.full((len(candidates), max(1, widest)), -1, dtype=np.int64)  # [B, C]
    for b, cands in enumerate(candidates):
        if cands:
            rows[b, : len(cands)] = retriever.rows(cands)
    scores = np.asarray(retriever.dot(users, rows), dtype=np.float32)  # [B, C]
    return [best(c, finite(scores[b, : len(c)]), width) for b, c in enumerate(candidates)]


def categories_of(retriever: Retriever | None, items: Sequence[str]) -> list[str]:
    """Each item's primary category by the retriever's table (``""``: unknown)."""
    if retriever is None or not items:
        return [""] * len(items)
    table = retriever.categories
    return [table[r] if r >= 0 else "" for r in np.asarray(retriever.rows(items)).tolist()]


def rerank_stage(
    retriever: Retriever | None,
    items: Sequence[str],
    scores: np.ndarray,
    *,
    top_k: int,
    window: int,
    category_cap: int,
) -> tuple[list[str], Scores]:
    """The reply: :func:`scoring.model.cascade.rerank` over the top ``window`` (at least
    ``top_k``) with the scene's category cap."""
    return rerank(
        items,
        scores,
        categories_of(retriever, items),
        top_k=top_k,
        window=max(window, top_k),
        category_cap=category_cap,
    )
