"""The ``reason`` codes of a :class:`~schemas.messages.RankResult` (part of the reply contract).

A normal reply has ``reason: null``. A degraded reply (fallback scores, ``degraded: true``) has
one of :data:`DEGRADED_REASONS` as its whole reason. An error reply (a refusal: no scores) has
``"<code>: <detail>"`` with the code one of :data:`ERROR_CODES`; clients recognise it by the
code before the colon. ``rank_result.schema.json`` lists both sets under ``$defs``, and a test
keeps them equal to these. A client should treat a code it does not know as degraded.
"""

from __future__ import annotations

from schemas.messages import RankResult

# degraded replies: the scores are a fallback (docs/scoring.md#replies says which)
EXPIRED = "expired"
REDIS_UNAVAILABLE = "redis_unavailable"
BREAKER_OPEN = "breaker_open"
NO_MODEL = "no_model"
MODEL_UNAVAILABLE = "model_unavailable"
INTERNAL_ERROR = "internal_error"  # scoring the batch raised unexpectedly
# cascade rungs: the reply is still ranked, by a cheaper path
RETRIEVAL_FALLBACK = "retrieval_fallback"  # candidates from the hot-item pool, not the index
RANK_SKIPPED = "rank_skipped"  # the deep model was late or failed: the coarse order
CACHED_FALLBACK = "cached_fallback"  # Redis down: the user's last cached result
DEGRADED_REASONS: frozenset[str] = frozenset(
    {
        EXPIRED, REDIS_UNAVAILABLE, BREAKER_OPEN, NO_MODEL, MODEL_UNAVAILABLE, INTERNAL_ERROR,
        RETRIEVAL_FALLBACK, RANK_SKIPPED, CACHED_FALLBACK,
    }
)  # fmt: skip

# error replies: the request was refused
INVALID_REQUEST = "invalid_request"
REPLY_TO_NOT_ALLOWED = "reply_to_not_allowed"
ERROR_CODES: frozenset[str] = frozenset({INVALID_REQUEST, REPLY_TO_NOT_ALLOWED})


def reason_code(reason: str | None) -> str | None:
    """The code of a reply's reason: the whole reason, or the part before ``": "``."""
    return None if reason is None else reason.split(":", 1)[0]


def is_error_reply(result: RankResult) -> bool:
    """True for a refusal (no scores), as opposed to a normal or degraded reply."""
    return reason_code(result.reason) in ERROR_CODES
