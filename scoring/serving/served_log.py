"""What the model saw: the served-log record, and rescoring one offline.

A record holds everything a score depended on besides the model version's weights and item
table (which the store keeps per version): the history (item ids, ts, event ids, actions), the
items shown (a request's own candidates, or what the cascade retrieved and kept) and, for a
version with side inputs, the raw feature values (``features``: the request's as-of time, its
categorical codes and its counts per item), and the items scored with a cold-start vector
(``cold_start``: item id -> the categories used). Rescoring it with the same version must
reproduce the logged scores.

Replies the version routed to could not score (degraded: fallback scores) are logged too, with
``degraded: true``, the reason and no sequence, so the outcomes worker can count a version's
degraded share; ``latency_ms`` (request produced -> reply built) gives its latency.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from schemas import RankRequest
from scoring.serving.assemble import assemble, gather
from scoring.serving.coldstart import apply_cold, cold_start_of
from scoring.serving.features import ServedFeatures, side_arrays
from scoring.serving.protocols import EmbeddingSource, Scorer
from streamrank import keys


def served_record(
    request: RankRequest,
    version: str,
    events: Sequence[Any],
    scores: Sequence[float],
    served_at: int,
    *,
    latency_ms: float | None = None,
    features: ServedFeatures | None = None,
    items: Sequence[str] | None = None,
    cached: bool = False,
    cold_start: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """The point-in-time record of one scored request (served-log topic, key = request_id).
    ``items``: the items shown, aligned with ``scores`` (default: the request's own); a reply
    from the result cache is marked ``cached``, with the features it was scored with;
    ``cold_start``: the items (shown or in the history) scored with a cold-start vector, and
    the categories it was built from."""
    record = _record(
        request, version, scores, served_at, latency_ms=latency_ms, degraded=False, items=items
    )
    if cached:
        record["cached"] = True
    record["sequence"] = {
        "item_ids": [e.item_id for e in events],
        "ts": [int(e.ts) for e in events],
        "event_ids": [e.event_id for e in events],
        "actions": [getattr(e, "action", None) for e in events],
    }
    if features is not None:
        record["features"] = features.to_json()
    if cold_start:
        record["cold_start"] = {item: list(names) for item, names in cold_start.items()}
    return record


def degraded_record(
    request: RankRequest,
    version: str,
    scores: Sequence[float],
    served_at: int,
    *,
    reason: str | None,
    latency_ms: float | None = None,
    items: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The record of a reply routed to ``version`` that got fallback scores instead (``items``:
    the items shown, default the request's own)."""
    record = _record(
        request, version, scores, served_at, latency_ms=latency_ms, degraded=True, items=items
    )
    record["reason"] = reason
    return record


def _record(
    request: RankRequest,
    version: str,
    scores: Sequence[float],
    served_at: int,
    *,
    latency_ms: float | None,
    degraded: bool,
    items: Sequence[str] | None,
) -> dict[str, Any]:
    return {
        "request_id": request.request_id,
        "user_id": request.user_id,
        "model_version": version,
        "items": list(request.items if items is None else items),
        "scores": list(scores),
        "served_at": served_at,
        "degraded": degraded,
        "latency_ms": latency_ms,
    }


async def rescore(
    record: Mapping[str, Any], *, scorer: Scorer, embeddings: EmbeddingSource
) -> np.ndarray:
    """Score a logged record again, alone (B=1), with the record's own version."""
    if record.get("degraded"):
        raise ValueError(
            f"served record {record.get('request_id')!r} is degraded: its scores are a fallback, "
            "not the version's; skip records with degraded true"
        )
    history = list(record["sequence"]["item_ids"])
    items = list(record["items"])
    batch = assemble([history], [items], max_history=max(1, len(history)))
    rows = await embeddings.lookup(record["model_version"], keys.ITEM_TABLE, batch.unique_ids)
    if record.get("cold_start"):
        cold = cold_start_of(scorer)
        if cold is None:
            raise ValueError(
                f"served record {record.get('request_id')!r} has cold-start items but the "
                f"scorer of {record['model_version']!r} has no cold-start parts"
            )
        rows = apply_cold(rows, batch.unique_ids, record["cold_start"], cold)
    hist, cands = gather(rows, batch)
    side = None
    if "features" in record:
        side = side_arrays(
            scorer.features, [ServedFeatures.from_json(record["features"])],
            width=batch.cand_mask.shape[1],
            actions=[record["sequence"].get("actions") or [None] * len(history)],
            hist_width=batch.hist_mask.shape[1],
        )  # fmt: skip
    scores = scorer.score(hist, batch.hist_mask, cands, batch.cand_mask, side)  # [1, C]
    return np.asarray(scores, dtype=np.float32)[0, : len(items)]
