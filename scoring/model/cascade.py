"""The cascade's candidate transforms, one definition for serving and offline evaluation.

Candidates are raw item ids. Every ordering is by score, best first, ties kept in candidate
order (a stable sort), so the same inputs give the same list online and offline.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Scores = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Widths:
    """How many candidates each stage keeps: the index returns ``retrieve``, the coarse cut
    keeps ``coarse`` for the deep model, the reranker may reorder the top ``rerank``."""

    retrieve: int
    coarse: int
    rerank: int

    def __post_init__(self) -> None:
        if min(self.retrieve, self.coarse, self.rerank) < 1:
            raise ValueError(f"every cascade width must be >= 1, got {self}")


def merge_candidates(sources: Iterable[Sequence[str]], *, limit: int) -> list[str]:
    """The sources' ids in order (the first source first), each id once, at most ``limit``."""
    out: dict[str, None] = {}
    for source in sources:
        for item in source:
            if len(out) >= limit:
                return list(out)
            out.setdefault(item, None)
    return list(out)


def filter_candidates(
    candidates: Sequence[str], *, seen: Collection[str], exclude: Collection[str]
) -> list[str]:
    """Candidates less those the user has seen (per the scene's rule) and those the request
    excludes."""
    if not seen and not exclude:
        return list(candidates)
    return [c for c in candidates if c not in seen and c not in exclude]


def by_score(scores: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Positions best first; equal scores keep their order; NaN sorts last."""
    values = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf)  # [C]
    return np.argsort(-values, kind="stable").astype(np.int64)


def best(candidates: Sequence[str], scores: npt.ArrayLike, width: int) -> tuple[list[str], Scores]:
    """The ``width`` best candidates and their scores, best first (the coarse cut, and the
    ``top_k`` of a request that brought its own items). Duplicated ids keep their best."""
    values = np.asarray(scores, dtype=np.float32)  # [C]
    if len(values) != len(candidates):
        raise ValueError(f"{len(candidates)} candidates but {len(values)} scores")
    kept: list[int] = []
    taken: set[str] = set()
    for pos in by_score(values).tolist():
        item = candidates[pos]
        if item in taken:
            continue
        taken.add(item)
        kept.append(pos)
        if len(kept) >= width:
            break
    return [candidates[p] for p in kept], values[kept]


def rerank(
    items: Sequence[str],
    scores: npt.ArrayLike,
    categories: Sequence[str],
    *,
    top_k: int,
    window: int,
    category_cap: int,
) -> tuple[list[str], Scores]:
    """The reply: the best ``top_k`` of the top ``window`` by score, at most ``category_cap``
    of one category (0 = no cap; ``""`` = unknown, never capped). When the cap leaves fewer
    than ``top_k``, the best capped items fill the rest. Best first, each id once."""
    ordered, values = best(items, scores, window)  # [W]
    cats = dict(zip(items, categories, strict=True))
    if category_cap <= 0:
        return ordered[:top_k], values[:top_k]
    counts: dict[str, int] = {}
    chosen: list[int] = []
    spare: list[int] = []
    for pos, item in enumerate(ordered):
        category = cats[item]
        if category and counts.get(category, 0) >= category_cap:
            spare.append(pos)
            continue
        counts[category] = counts.get(category, 0) + 1
        chosen.append(pos)
    picked = sorted(chosen[:top_k] + spare[: max(0, top_k - len(chosen))])
    return [ordered[p] for p in picked], values[picked]
