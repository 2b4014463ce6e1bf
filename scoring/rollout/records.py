"""What the outcomes worker reads and writes: served-log records in, outcome records out.

The served log (``served_log_topic``, key = request_id) is written by the scoring worker
(:func:`scoring.serving.served_log.served_record`): one record per reply routed to a model
version, ``degraded`` true when the version did not score it (fallback scores). The decoder
here is total: any bytes give a :class:`Served` or a :class:`ContractError` with a reason (the
record is then dead-lettered). Records of older workers lack ``degraded`` and ``latency_ms``;
they read as scored, without a latency.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from streamrank.errors import ContractError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class Served:
    """One served-log record, as the join needs it (the history is not needed)."""

    request_id: str
    user_id: str
    version: str
    items: tuple[str, ...]
    scores: tuple[float, ...]
    served_at: int  # epoch ms
    degraded: bool = False
    latency_ms: float | None = None


def _text(obj: Mapping[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value or _CONTROL.search(value):
        raise ContractError(
            f"served record field '{name}' must be a non-empty string without control characters",
            field=name,
            reason="bad_type" if not isinstance(value, str) else "bad_value",
        )
    return value


def decode_served(raw: bytes | str | None) -> Served:
    """Parse and validate one served-log record."""
    if raw is None:
        raise ContractError("served record has no value", reason="empty")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ContractError(f"served record is not JSON: {exc}", reason="not_json") from None
    if not isinstance(obj, dict):
        raise ContractError("served record must be a JSON object", reason="not_object")
    request_id, user_id = _text(obj, "request_id"), _text(obj, "user_id")
    version = _text(obj, "model_version")
    items, scores = obj.get("items"), obj.get("scores")
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise ContractError(
            "served record 'items' must be a non-empty array of strings",
            field="items",
            reason="bad_type",
        )
    if any(_CONTROL.search(i) for i in items):
        raise ContractError(
            "served record 'items' hold a control character", field="items", reason="bad_value"
        )
    if (
        not isinstance(scores, list)
        or len(scores) != len(items)
        or not all(
            isinstance(s, int | float) and not isinstance(s, bool) and math.isfinite(s)
            for s in scores
        )
    ):
        raise ContractError(
            "served record 'scores' must be finite numbers, one per item",
            field="scores",
            reason="bad_value",
        )
    served_at = obj.get("served_at")
    if isinstance(served_at, bool) or not isinstance(served_at, int) or served_at <= 0:
        raise ContractError(
            "served record 'served_at' must be epoch milliseconds",
            field="served_at",
            reason="bad_type",
        )
    degraded = obj.get("degraded", False)
    if not isinstance(degraded, bool):
        raise ContractError(
            "served record 'degraded' must be a boolean", field="degraded", reason="bad_type"
        )
    latency = obj.get("latency_ms")
    if latency is not None and (
        isinstance(latency, bool) or not isinstance(latency, int | float) or latency < 0
    ):
        raise ContractError(
            "served record 'latency_ms' must be a non-negative number",
            field="latency_ms",
            reason="bad_type",
        )
    return Served(
        request_id=request_id,
        user_id=user_id,
        version=version,
        items=tuple(items),
        scores=tuple(float(s) for s in scores),
        served_at=served_at,
        degraded=degraded,
        latency_ms=None if latency is None else float(latency),
    )


def outcome_record(
    user_id: str, request_id: str, pending: Mapping[str, Any], *, closed_at: int
) -> dict[str, Any]:
    """The final outcome of one request (outcomes topic, key = request_id), from its pending
    record as the join script keeps it: which ranked items were clicked, at which rank."""
    items: Sequence[str] = pending["i"]
    ranks: Sequence[int] = pending["r"]
    raw_clicks = pending.get("c") or {}
    clicked = sorted(
        (
            {"item": items[int(pos) - 1], "rank": int(ranks[int(pos) - 1]), "event_id": event}
            for pos, event in (raw_clicks.items() if isinstance(raw_clicks, dict) else ())
        ),
        key=lambda c: c["rank"],
    )
    return {
        "request_id": request_id,
        "user_id": user_id,
        "model_version": pending["v"],
        "served_at": int(pending["t"]),
        "closed_at": closed_at,
        "items": list(items),
        "clicked": clicked,
        "best_rank": clicked[0]["rank"] if clicked else None,
    }
