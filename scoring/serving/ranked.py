"""What ranking takes and gives per request: :class:`Incoming` in, :class:`Ranked` out, and the
one place a :class:`~schemas.RankResult` is built (timings, ``top_k`` of a request's own items,
fallback scores)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from schemas import RankRequest, RankResult
from scoring.model.cascade import best
from scoring.serving import replies

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Incoming:
    """A valid request with when it was produced (Kafka timestamp) and received, epoch ms."""

    request: RankRequest
    produced_ms: int
    received_ms: int


@dataclass(slots=True)
class Ranked:
    """A reply and, for model-scored requests, the what-the-model-saw record."""

    result: RankResult
    served: dict[str, Any] | None = None


def build_result(
    incoming: Incoming,
    scores: Sequence[float],
    version: str,
    *,
    degraded: bool,
    reason: str | None,
    stages: Mapping[str, float],
    start: float | None,
    now_ms: int,
    items: Sequence[str] | None = None,
    cached: bool = False,
) -> RankResult:
    """The reply of one request. ``items`` default to the request's own, with ``scores``
    aligned (neutral when a degraded reply has none); a request that brought items and a
    ``top_k`` gets their best ``top_k``, best first, each id once. ``start``: the
    ``perf_counter`` the batch began at (None: no total)."""
    request = incoming.request
    timings = {"queue_wait": float(max(0, incoming.received_ms - incoming.produced_ms))}
    timings.update({k: round(v, 3) for k, v in stages.items()})
    if start is not None:
        timings["total"] = round((time.perf_counter() - start) * 1000 + timings["queue_wait"], 3)
    shown: Sequence[str] = request.items if items is None else items
    if items is None:
        if degraded and not scores and shown:
            scores = replies.neutral_scores(len(shown)).tolist()
        if request.top_k is not None and shown:
            kept, values = best(shown, scores, request.top_k)
            shown, scores = kept, values.tolist()
    return RankResult(
        request_id=request.request_id,
        user_id=request.user_id,
        items=tuple(shown),
        scores=tuple(float(s) for s in scores),
        model_version=version,
        degraded=degraded,
        reason=reason,
        timings_ms=timings,
        served_at=now_ms,
        cached=cached,
    )


def latency_ms(result: RankResult) -> float | None:
    """Request produced -> reply built, as the reply's timings say."""
    timings = result.timings_ms
    value = timings.get("total", timings.get("queue_wait"))
    return None if value is None else float(value)


def pick(values: Sequence[T], positions: Sequence[int]) -> list[T]:
    """``values`` at ``positions`` (a part of a batch, in order)."""
    return [values[i] for i in positions]
