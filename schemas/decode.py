"""The validating decoders of the message contracts (types: :mod:`schemas.messages`).

These decoders and the JSON Schema files (``*.schema.json``) describe the same contract; a test
feeds one corpus to both, and property-based tests feed them arbitrary bytes and arbitrary JSON
in every field. Unknown extra fields are accepted and ignored, so producers can add fields
without breaking older consumers. Decoders are total, pure functions, fast enough for the hot
path (orjson plus explicit checks): they return a message or raise :class:`ContractError`
naming the field and what was wrong, never another exception.
"""

from __future__ import annotations

import re
from typing import Any, cast

import orjson

from schemas.messages import (
    ACTIONS,
    DEAD_LETTER_MAX_BYTES,
    DEFAULT_LIMITS,
    DEFAULT_SCENE,
    MAX_ATTRIBUTE_VALUES,
    MAX_ATTRIBUTES,
    MAX_TS_MS,
    Action,
    AttributeValue,
    ClickEvent,
    DeadLetter,
    ItemEvent,
    Limits,
    RankRequest,
    RankResult,
)
from streamrank.errors import ContractError

# Ids may hold any printable text; control characters are refused because the Redis key
# contract uses \x1f as a field separator inside values.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _load_object(raw: bytes | str, limits: Limits) -> dict[str, Any]:
    if raw is None:
        raise ContractError("message has no value (null payload)", field=None, reason="empty")
    size = len(raw)
    if size > limits.max_message_bytes:
        raise ContractError(
            f"message is {size} bytes, over the limit of {limits.max_message_bytes}",
            reason="too_large",
        )
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ContractError(f"not valid UTF-8 JSON: {exc}", reason="not_json") from None
    if not isinstance(obj, dict):
        raise ContractError(f"expected a JSON object, got {_json_type(obj)}", reason="not_object")
    return obj


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _id(obj: dict[str, Any], name: str, limits: Limits, *, required: bool = True) -> Any:
    if name not in obj:
        if required:
            raise ContractError(f"field '{name}' is missing", field=name, reason="missing_field")
        return None
    value = obj[name]
    if value is None and not required:
        return None
    return _check_id(value, name, limits)


def _check_id(value: Any, name: str, limits: Limits) -> str:
    if not isinstance(value, str):
        raise ContractError(
            f"field '{name}' must be a string, got {_json_type(value)}",
            field=name,
            reason="bad_type",
        )
    if not value:
        raise ContractError(f"field '{name}' must not be empty", field=name, reason="bad_value")
    if len(value) > limits.max_id_length:
        raise ContractError(
            f"field '{name}' is {len(value)} characters, over the limit of {limits.max_id_length}",
            field=name,
            reason="too_long",
        )
    if _CONTROL.search(value):
        raise ContractError(
            f"field '{name}' contains a control character", field=name, reason="bad_value"
        )
    return value


def _all_plain_ids(values: list[Any], limits: Limits) -> bool:
    """Whether every value passes :func:`_check_id`, checked at once: a request's items one by
    one would be a visible share of the scoring worker's time (docs/benchmarks.md)."""
    longest = limits.max_id_length
    if not all(type(v) is str and 0 < len(v) <= longest for v in values):
        return False
    return _CONTROL.search("".join(values)) is None


def _int(
    obj: dict[str, Any], name: str, *, required: bool, minimum: int = 0, maximum: int | None = None
) -> Any:
    if name not in obj or obj[name] is None:
        if required:
            reason = "missing_field" if name not in obj else "bad_type"
            what = "is missing" if name not in obj else "must be an integer, got null"
            raise ContractError(f"field '{name}' {what}", field=name, reason=reason)
        return None
    value = obj[name]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(
            f"field '{name}' must be an integer, got {_json_type(value)}",
            field=name,
            reason="bad_type",
        )
    if value < minimum:
        raise ContractError(
            f"field '{name}' must be >= {minimum}, got {value}", field=name, reason="bad_value"
        )
    if maximum is not None and value > maximum:
        raise ContractError(
            f"field '{name}' must be <= {maximum}, got {str(value)[:40]}",
            field=name,
            reason="bad_value",
        )
    return value


def decode_click(raw: bytes | str, limits: Limits = DEFAULT_LIMITS) -> ClickEvent:
    """Parse and validate one ClickEvent."""
    obj = _load_object(raw, limits)
    category = obj.get("category")
    if category is not None:
        category = _check_id(category, "category", limits)
    action = obj.get("action", "click")
    if not isinstance(action, str):
        raise ContractError(
            f"field 'action' must be a string, one of {sorted(ACTIONS)}, got {_json_type(action)}",
            field="action",
            reason="bad_type",
        )
    if action not in ACTIONS:
        raise ContractError(
            f"field 'action' must be one of {sorted(ACTIONS)}, got {action[:40]!r}",
            field="action",
            reason="bad_value",
        )
    return ClickEvent(
        event_id=_id(obj, "event_id", limits),
        user_id=_id(obj, "user_id", limits),
        item_id=_id(obj, "item_id", limits),
        ts=_int(obj, "ts", required=True),
        category=category,
        action=cast(Action, action),  # checked against ACTIONS above
    )


def decode_item(raw: bytes | str, limits: Limits = DEFAULT_LIMITS) -> ItemEvent:
    """Parse and validate one ItemEvent."""
    obj = _load_object(raw, limits)
    item_id = _id(obj, "item_id", limits)
    category = obj.get("category")
    if category is not None:
        category = _check_id(category, "category", limits)
    return ItemEvent(
        item_id=item_id,
        category=category,
        ts=_int(obj, "ts", required=True, maximum=MAX_TS_MS),
        attributes=_attributes(obj.get("attributes"), limits),
    )


def _attributes(value: Any, limits: Limits) -> dict[str, AttributeValue]:
    """An ItemEvent's attributes: null or an object of at most :data:`MAX_ATTRIBUTES` names,
    each a string or an array of at most :data:`MAX_ATTRIBUTE_VALUES` strings (ids' rules)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ContractError(
            f"field 'attributes' must be an object or null, got {_json_type(value)}",
            field="attributes",
            reason="bad_type",
        )
    if len(value) > MAX_ATTRIBUTES:
        raise ContractError(
            f"field 'attributes' has {len(value)} names, over the limit of {MAX_ATTRIBUTES}",
            field="attributes",
            reason="too_many_items",
        )
    out: dict[str, AttributeValue] = {}
    for name, entry in value.items():
        _check_id(name, "attributes (a name)", limits)
        where = f"attributes.{name[:40]}"
        if isinstance(entry, list):
            if len(entry) > MAX_ATTRIBUTE_VALUES:
                raise ContractError(
                    f"field '{where}' has {len(entry)} values, over the limit of "
                    f"{MAX_ATTRIBUTE_VALUES}",
                    field=where,
                    reason="too_many_items",
                )
            out[name] = tuple(_check_id(v, f"{where}[{k}]", limits) for k, v in enumerate(entry))
        elif isinstance(entry, str):
            out[name] = _check_id(entry, where, limits)
        else:
            raise ContractError(
                f"field '{where}' must be a string or an array of strings, got {_json_type(entry)}",
                field=where,
                reason="bad_type",
            )
    return out


def _id_list(obj: dict[str, Any], name: str, limits: Limits) -> tuple[str, ...] | None:
    """An optional array of ids (None when absent or null), at most ``max_items``."""
    values = obj.get(name)
    if values is None:
        return None
    if not isinstance(values, list):
        raise ContractError(
            f"field '{name}' must be an array of strings, got {_json_type(values)}",
            field=name,
            reason="bad_type",
        )
    if len(values) > limits.max_items:
        raise ContractError(
            f"field '{name}' has {len(values)} entries, over the limit of {limits.max_items}",
            field=name,
            reason="too_many_items",
        )
    if not _all_plain_ids(values, limits):  # the per-item walk names the first bad one
        for index, value in enumerate(values):
            _check_id(value, f"{name}[{index}]", limits)
    return tuple(values)


def decode_request(raw: bytes | str, limits: Limits = DEFAULT_LIMITS) -> RankRequest:
    """Parse and validate one RankRequest."""
    obj = _load_object(raw, limits)
    request_id = _id(obj, "request_id", limits)
    user_id = _id(obj, "user_id", limits)
    items = _id_list(obj, "items", limits)
    if items is not None and not items:
        raise ContractError(
            "field 'items' must not be empty (omit it, or send null, to have the engine "
            "retrieve candidates)",
            field="items",
            reason="empty_items",
        )
    context = obj.get("context")
    if context is not None and not isinstance(context, dict):
        raise ContractError(
            f"field 'context' must be an object or null, got {_json_type(context)}",
            field="context",
            reason="bad_type",
        )
    reply_to = obj.get("reply_to")
    if reply_to is not None:
        reply_to = _check_id(reply_to, "reply_to", limits)
    scene = obj.get("scene")
    return RankRequest(
        request_id=request_id,
        user_id=user_id,
        items=items or (),
        context=context,
        deadline_ms=_int(obj, "deadline_ms", required=False),
        reply_to=reply_to,
        ts=_int(obj, "ts", required=False, maximum=MAX_TS_MS),
        top_k=_int(obj, "top_k", required=False, minimum=1, maximum=limits.max_items),
        scene=DEFAULT_SCENE if scene is None else _check_id(scene, "scene", limits),
        exclude=_id_list(obj, "exclude", limits) or (),
    )


def peek_field(
    raw: bytes | str | None, name: str, *, max_length: int = DEFAULT_LIMITS.max_id_length
) -> str | None:
    """Best-effort string field of a message that failed validation (e.g. to send an error
    reply to its ``request_id`` on its ``reply_to``); None when it is missing, not a string,
    holds a control character or is longer than ``max_length`` (an error reply must not carry
    a megabyte id)."""
    if not raw:
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    value = obj.get(name) if isinstance(obj, dict) else None
    if not isinstance(value, str) or not value or len(value) > max_length:
        return None
    return None if _CONTROL.search(value) else value


def peek_request_id(
    raw: bytes | str | None, *, max_length: int = DEFAULT_LIMITS.max_id_length
) -> str | None:
    """Best-effort request_id of a message that failed validation, to send an error reply."""
    return peek_field(raw, "request_id", max_length=max_length)


def decode_result(raw: bytes | str, limits: Limits = DEFAULT_LIMITS) -> RankResult:
    """Parse and validate one RankResult (used by clients and tests)."""
    obj = _load_object(raw, limits)
    for name in ("request_id", "user_id", "model_version"):
        if not isinstance(obj.get(name), str):
            raise ContractError(f"field '{name}' must be a string", field=name, reason="bad_type")
    items, scores = obj.get("items"), obj.get("scores")
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ContractError(
            "field 'items' must be an array of strings", field="items", reason="bad_type"
        )
    if not isinstance(scores, list) or not all(_is_number(s) for s in scores):
        raise ContractError(
            "field 'scores' must be an array of numbers", field="scores", reason="bad_type"
        )
    if len(scores) != len(items):
        raise ContractError(
            f"field 'scores' has {len(scores)} entries but 'items' has {len(items)}",
            field="scores",
            reason="bad_value",
        )
    if not isinstance(obj.get("degraded"), bool):
        raise ContractError(
            "field 'degraded' must be a boolean", field="degraded", reason="bad_type"
        )
    if "reason" not in obj:
        raise ContractError("field 'reason' is missing", field="reason", reason="missing_field")
    reason = obj["reason"]
    if reason is not None and not isinstance(reason, str):
        raise ContractError(
            "field 'reason' must be a string or null", field="reason", reason="bad_type"
        )
    timings = obj.get("timings_ms")
    if not isinstance(timings, dict) or not all(_is_number(v) for v in timings.values()):
        raise ContractError(
            "field 'timings_ms' must be an object of numbers", field="timings_ms", reason="bad_type"
        )
    cached = obj.get("cached", False)
    if not isinstance(cached, bool):
        raise ContractError("field 'cached' must be a boolean", field="cached", reason="bad_type")
    return RankResult(
        request_id=obj["request_id"],
        user_id=obj["user_id"],
        items=tuple(items),
        scores=tuple(float(s) for s in scores),
        model_version=obj["model_version"],
        degraded=obj["degraded"],
        reason=reason,
        timings_ms=timings,
        served_at=_int(obj, "served_at", required=True),
        cached=cached,
    )


def _headers(value: Any) -> tuple[dict[str, Any], ...]:
    problem = "field 'headers' must be an array of {key: string, value: string or null}"
    if not isinstance(value, list):
        raise ContractError(problem, field="headers", reason="bad_type")
    for header in value:
        if (
            not isinstance(header, dict)
            or not isinstance(header.get("key"), str)
            or "value" not in header
            or not (header["value"] is None or isinstance(header["value"], str))
            or header.get("encoding", "utf-8") not in ("utf-8", "base64")
        ):
            raise ContractError(problem, field="headers", reason="bad_type")
    return tuple(value)


def decode_dead_letter(raw: bytes | str, limits: Limits = DEFAULT_LIMITS) -> DeadLetter:
    """Parse one DeadLetter (used by tooling and tests): as large as :meth:`DeadLetter.wrap`
    makes one (the record's bytes, base64 at worst, up to its truncation, and headers)."""
    largest = max(limits.max_message_bytes * 2, DEAD_LETTER_MAX_BYTES)
    obj = _load_object(raw, Limits(largest, limits.max_items, limits.max_id_length))
    for name in ("source_topic", "error", "payload"):
        if not isinstance(obj.get(name), str):
            raise ContractError(f"field '{name}' must be a string", field=name, reason="bad_type")
    encoding = obj.get("payload_encoding", "utf-8")
    if encoding not in ("utf-8", "base64"):
        raise ContractError(
            "field 'payload_encoding' must be 'utf-8' or 'base64'",
            field="payload_encoding",
            reason="bad_value",
        )
    return DeadLetter(
        headers=_headers(obj.get("headers", [])),
        source_topic=obj["source_topic"],
        partition=_int(obj, "partition", required=True),
        offset=_int(obj, "offset", required=True),
        error=obj["error"],
        payload=obj["payload"],
        at=_int(obj, "at", required=True),
        payload_encoding=encoding,
    )
