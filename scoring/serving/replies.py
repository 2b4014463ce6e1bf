"""Reply routing, deadlines and the replies that carry no model scores (pure functions); the
reason codes are part of the contract (:mod:`schemas.reasons`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from schemas import RankRequest, RankResult


def reply_topic(
    request_reply_to: str | None, *, default: str, allowed: Sequence[str]
) -> str | None:
    """Where the reply goes: the results topic or an allowed ``reply_to``; None = refused."""
    if request_reply_to is None or request_reply_to == default:
        return default
    return request_reply_to if request_reply_to in allowed else None


def deadline_ms(request: RankRequest, *, produced_ms: int, budget_ms: int) -> int:
    """The request's own deadline, else the default budget from when it was produced."""
    return request.deadline_ms if request.deadline_ms is not None else produced_ms + budget_ms


def error_reply(
    request_id: str, user_id: str, code: str, detail: str, *, now_ms: int
) -> RankResult:
    """A refusal: no scores, so the caller is not left waiting."""
    return RankResult(
        request_id=request_id,
        user_id=user_id,
        items=(),
        scores=(),
        model_version="",
        degraded=True,
        reason=f"{code}: {detail}",
        served_at=now_ms,
    )


def neutral_scores(n: int) -> np.ndarray:
    """Equal scores: the caller's own order stands (a stable sort keeps it)."""
    return np.full(n, 0.5, dtype=np.float32)


def popularity_scores(popularity: np.ndarray) -> np.ndarray:
    """Recent clicks -> scores in [0, 1), monotone in popularity and independent of the other
    candidates, so the same item gets the same fallback score in every request."""
    pop = np.maximum(np.asarray(popularity, dtype=np.float64), 0.0)
    return (1.0 - 1.0 / (1.0 + np.log1p(pop))).astype(np.float32)
