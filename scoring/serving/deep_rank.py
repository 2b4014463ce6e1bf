"""The deep model's part of ranking: the requests one version serves -> one embedding lookup
for the union of their ids -> DIN -> scores per request. Shared by requests that bring their
own candidates and by the cascade's rank stage (which runs the forward on a worker thread with
its budget)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from scoring.model.side import SideArrays
from scoring.serving.assemble import assemble, gather, split_scores
from scoring.serving.coldstart import ColdMap, cold_lookup
from scoring.serving.features import ServedFeatures, side_arrays
from scoring.serving.protocols import EmbeddingSource, ItemAttributeSource, Scorer
from scoring.serving.watcher import RecentIds

ForwardMode = Literal["batched", "per_request"]
# Runs the forward (a no-argument call) somewhere and returns its scores; None: inline.
Offload = Callable[[Callable[[], np.ndarray]], Awaitable[np.ndarray]]


def forward(
    scorer: Scorer,
    hist: np.ndarray,
    hist_mask: np.ndarray,
    cands: np.ndarray,
    cand_mask: np.ndarray,
    side: SideArrays | None = None,
    *,
    mode: ForwardMode,
) -> np.ndarray:
    """``[B, C]`` scores, one call for the batch or one per request (trimmed to its own sizes)."""
    if mode == "batched" or hist.shape[0] == 1:
        return np.asarray(scorer.score(hist, hist_mask, cands, cand_mask, side), dtype=np.float32)
    out = np.zeros(cand_mask.shape, dtype=np.float32)  # [B, C]
    hist_len = np.maximum(hist_mask.sum(axis=1), 1)
    cand_len = cand_mask.sum(axis=1)
    for b in range(hist.shape[0]):
        h, c = int(hist_len[b]), int(cand_len[b])
        one = None
        if side is not None:
            one = SideArrays(
                None if side.codes is None else side.codes[b : b + 1],
                None if side.dense is None else side.dense[b : b + 1, :c],
                None if side.actions is None else side.actions[b : b + 1, :h],
            )
        out[b, :c] = scorer.score(
            hist[b : b + 1, :h],
            hist_mask[b : b + 1, :h],
            cands[b : b + 1, :c],
            cand_mask[b : b + 1, :c],
            one,
        )[0]
    return out


@dataclass(frozen=True, slots=True)
class GroupInputs:
    """What one version scores for some requests (aligned lists): each history (item ids and
    actions, oldest first, already cut to ``length``), candidates and raw side features."""

    histories: Sequence[Sequence[str]]
    actions: Sequence[Sequence[str | None]]
    candidates: Sequence[Sequence[str]]
    served: Sequence[ServedFeatures]
    length: int


@dataclass(frozen=True, slots=True)
class GroupScores:
    """Scores per request, aligned with its candidates, and the seconds the lookup and the
    forward took."""

    scores: list[list[float]]
    lookup_s: float
    forward_s: float
    cold: ColdMap = field(default_factory=dict)  # ids scored with a cold-start vector


class DeepRanker:
    """Scores the requests of one version: one embedding lookup, one forward (per request or
    batched, ``mode``). With ``attributes``, ids the version does not know but whose
    attributes are known get cold-start vectors (:mod:`.coldstart`); ``on_cold(n)`` counts
    them."""

    def __init__(
        self,
        *,
        embeddings: EmbeddingSource,
        mode: ForwardMode,
        recent: RecentIds | None,
        attributes: ItemAttributeSource | None = None,
        on_cold: Callable[[int], None] | None = None,
    ) -> None:
        self._embeddings = embeddings
        self._mode: ForwardMode = mode
        self._recent = recent
        self._attributes = attributes
        self._on_cold = on_cold

    async def score(
        self,
        version: str,
        scorer: Scorer,
        inputs: GroupInputs,
        *,
        bound: Callable[[], asyncio.Timeout],
        offload: Offload | None = None,
    ) -> GroupScores:
        """``bound()`` limits the lookup's Redis wait; ``offload`` runs the forward (inline
        when None). Raises what the lookup or the forward raise."""
        assembled = assemble(inputs.histories, inputs.candidates, max_history=inputs.length)
        side = side_arrays(
            scorer.features, inputs.served, width=assembled.cand_mask.shape[1],
            actions=inputs.actions, hist_width=assembled.hist_mask.shape[1],
        )  # fmt: skip
        t1 = time.perf_counter()
        rows, cold = await cold_lookup(
            self._embeddings, self._attributes, version, scorer, assembled.unique_ids,
            bound=bound,
        )  # fmt: skip
        if cold and self._on_cold is not None:
            self._on_cold(len(cold))
        t2 = time.perf_counter()
        hist, cands = gather(rows, assembled)

        def run() -> np.ndarray:
            return forward(
                scorer, hist, assembled.hist_mask, cands, assembled.cand_mask, side,
                mode=self._mode,
            )  # fmt: skip

        probs = run() if offload is None else await offload(run)  # [B, C]
        t3 = time.perf_counter()
        if self._recent is not None:
            self._recent.add(assembled.unique_ids)
        return GroupScores(split_scores(probs, assembled), t2 - t1, t3 - t2, cold)
