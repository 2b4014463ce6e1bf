"""The whole cascade offline, with the transforms the scoring worker runs
(:mod:`scoring.model.cascade`): ANN retrieve N -> filter the seen items -> coarse cut to M by
the towers' dot product -> DIN (the serving scorer, side inputs as of the request) on the M ->
rerank (per-category cap) -> the top ``top_k``.

The hot-item pool is wall-clock state, so it is merged as 0 items here (and in the replay that
checks the online cascade against this one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from scoring.model.cascade import Widths, best, filter_candidates, merge_candidates, rerank
from scoring.model.retrieval import Retriever
from scoring.training.data import Dataset, Samples

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class CascadeConfig:
    """The widths and the scene rule of the offline cascade (the defaults of the cascade
    settings: ``streamrank train`` passes the configured ones)."""

    widths: Widths = field(default_factory=lambda: Widths(retrieve=1000, coarse=200, rerank=50))
    top_k: int = 10
    filter_seen: bool = True
    category_cap: int = 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "widths": asdict(self.widths)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> CascadeConfig:
        """The inverse of :meth:`to_json` (what config.json records under
        ``retrieval.train.cascade``); ValueError naming what is wrong."""
        try:
            w = raw["widths"]
            return cls(
                widths=Widths(int(w["retrieve"]), int(w["coarse"]), int(w["rerank"])),
                top_k=int(raw["top_k"]),
                filter_seen=bool(raw["filter_seen"]),
                category_cap=int(raw["category_cap"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a cascade config (widths, top_k, filter_seen, "
                             f"category_cap): {exc!r}") from exc  # fmt: skip


@dataclass(frozen=True)
class CascadeResult:
    """Per test user: the reply (``items`` raw ids, ``scores`` DIN probabilities, best first)
    and the cascade's whole order (the reply, then the other DIN-scored survivors) as rows."""

    items: list[list[str]]
    scores: list[list[float]]
    order: IntArray  # [U, W] rows, -1 padded


def survivors(
    retriever: Retriever,
    users: FloatArray,
    histories: list[list[str]],
    cfg: CascadeConfig,
) -> list[list[str]]:
    """Retrieve, filter and cut each user's candidates to the coarse width (raw ids)."""
    rows, _ = retriever.search(users, cfg.widths.retrieve)  # [U, N]
    ids = retriever.item_ids
    out: list[list[str]] = []
    for u, history in enumerate(histories):
        found = [ids[r] for r in rows[u].tolist() if r >= 0]
        merged = merge_candidates([found], limit=cfg.widths.retrieve)
        seen = set(history) if cfg.filter_seen else set()
        kept = filter_candidates(merged, seen=seen, exclude=())
        coarse = retriever.dot(users[u : u + 1], retriever.rows(kept)[None])[0]  # [c]
        cut, _ = best(kept, coarse, cfg.widths.coarse)
        out.append(cut)
    return out


def run_cascade(
    ds: Dataset,
    test: Samples,
    retriever: Retriever,
    users: FloatArray,
    histories: list[list[str]],
    din_scores: Any,
    cfg: CascadeConfig,
    *,
    width: int,
    progress: bool = False,
) -> CascadeResult:
    """The cascade for every test user. ``din_scores(rows [b, M], valid [b, M], users slice)``
    gives the DIN probabilities of a chunk of users' survivors."""
    cut = survivors(retriever, users, histories, cfg)
    m = max((len(c) for c in cut), default=0)
    rows = np.full((len(cut), max(m, 1)), -1, dtype=np.int64)  # [U, M]
    for u, c in enumerate(cut):
        rows[u, : len(c)] = retriever.rows(c)
    valid = rows >= 0  # [U, M]
    probs = np.zeros(rows.shape, dtype=np.float32)  # [U, M]
    chunk = 64
    for s in tqdm(range(0, len(cut), chunk), desc="cascade", unit="chunk", disable=not progress):
        part = slice(s, min(s + chunk, len(cut)))
        probs[part] = din_scores(rows[part], valid[part], part)
    items: list[list[str]] = []
    scores: list[list[float]] = []
    order = np.full((len(cut), width), -1, dtype=np.int64)  # [U, W]
    for u, c in enumerate(cut):
        din = probs[u, : len(c)]  # [c]
        cats = [retriever.categories[r] for r in rows[u, : len(c)].tolist()]
        reply, reply_scores = rerank(c, din, cats, top_k=cfg.top_k, window=cfg.widths.rerank,
                                     category_cap=cfg.category_cap)  # fmt: skip
        items.append(reply)
        scores.append([float(x) for x in reply_scores])
        rest, _ = best(c, din, len(c))
        taken = set(reply)
        whole = reply + [i for i in rest if i not in taken]
        ranked = retriever.rows(whole[:width])
        order[u, : len(ranked)] = ranked
    return CascadeResult(items, scores, order)
