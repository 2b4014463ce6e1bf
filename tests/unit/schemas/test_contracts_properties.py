"""Property-based proof that the decoders are total and agree with the JSON Schema files.

For any bytes, and for any JSON value in any field of any message type, a decoder returns a
valid message or raises ContractError with a reason: never another exception (a TypeError from
``"action": {}`` once crashed the features worker). On every generated JSON document the JSON
Schema file and the decoder accept and reject the same documents.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schemas import (
    DEFAULT_LIMITS,
    ClickEvent,
    DeadLetter,
    ItemEvent,
    RankRequest,
    RankResult,
    decode_click,
    decode_dead_letter,
    decode_item,
    decode_request,
    decode_result,
    json_schema,
    peek_field,
)
from streamrank.errors import ContractError

DECODERS: dict[str, tuple[Callable[..., Any], type]] = {
    "ClickEvent": (decode_click, ClickEvent),
    "RankRequest": (decode_request, RankRequest),
    "RankResult": (decode_result, RankResult),
    "DeadLetter": (decode_dead_letter, DeadLetter),
    "ItemEvent": (decode_item, ItemEvent),
}
VALIDATORS = {kind: jsonschema.Draft202012Validator(json_schema(kind)) for kind in DECODERS}
PROPERTIES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Any JSON value: what a producer in any language may put in a field. Integers beyond 64 bits
# and integer-valued floats are included; non-finite floats are not JSON.
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["", " ", "click", "view", "a\x1fb", "é", "x" * 129, "\u200b", "0"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = st.text(min_size=1, max_size=12).filter(
    lambda s: not any(ord(c) < 32 or ord(c) == 127 for c in s)
)
epoch_ms = st.integers(min_value=0, max_value=4_000_000_000_000)

FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "ClickEvent": {
        "event_id": ids,
        "user_id": ids,
        "item_id": ids,
        "ts": epoch_ms,
        "category": st.none() | ids,
        "action": st.sampled_from(["click", "view", "cart", "purchase"]),
    },
    "RankRequest": {
        "request_id": ids,
        "user_id": ids,
        "items": st.lists(ids, min_size=1, max_size=5),
        "context": st.none() | st.dictionaries(st.text(max_size=5), json_values, max_size=3),
        "deadline_ms": st.none() | epoch_ms,
        "reply_to": st.none() | ids,
        "ts": st.none() | epoch_ms | st.sampled_from([253_402_300_799_999, 253_402_300_800_000]),
    },
    "RankResult": {
        "request_id": ids,
        "user_id": ids,
        "items": st.just(["a", "b"]),
        "scores": st.just([0.5, 0.25]) | st.lists(st.floats(0, 1), max_size=3),
        "model_version": ids,
        "degraded": st.booleans(),
        "reason": st.none() | st.text(max_size=10),
        "timings_ms": st.dictionaries(st.text(max_size=5), st.floats(0, 100), max_size=3),
        "served_at": epoch_ms,
    },
    "ItemEvent": {
        "item_id": ids,
        "category": st.none() | ids,
        "ts": epoch_ms,
        "attributes": st.none()
        | st.dictionaries(ids, ids | st.lists(ids, max_size=3), max_size=3)
        | st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    },
    "DeadLetter": {
        "source_topic": ids,
        "partition": st.integers(0, 100),
        "offset": st.integers(0, 10**12),
        "error": st.text(max_size=20),
        "payload": st.text(max_size=20),
        "payload_encoding": st.sampled_from(["utf-8", "base64"]),
        "at": epoch_ms,
        "headers": st.lists(
            st.fixed_dictionaries(
                {"key": st.text(max_size=5), "value": st.none() | st.text(max_size=5)}
            ),
            max_size=2,
        ),
    },
}


@st.composite
def documents(draw: st.DrawFn, kind: str) -> Any:
    """A document of ``kind`` where each field is valid, any JSON value, or missing."""
    doc: dict[str, Any] = {}
    for name, valid in FIELDS[kind].items():
        choice = draw(st.sampled_from(["valid", "valid", "valid", "any", "missing"]))
        if choice == "valid":
            doc[name] = draw(valid)
        elif choice == "any":
            doc[name] = draw(json_values)
    if draw(st.booleans()):
        doc[draw(st.text(max_size=6))] = draw(json_values)  # extra fields are ignored
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)  # not even an object
    return doc


def decode(kind: str, raw: bytes) -> bool:
    """True when the decoder accepts, False when it raises ContractError; any other exception
    fails the test."""
    decoder, cls = DECODERS[kind]
    try:
        message = decoder(raw)
    except ContractError as exc:
        assert exc.reason and isinstance(exc.reason, str)
        assert str(exc)
        return False
    assert isinstance(message, cls)
    return True


@PROPERTIES
@given(kind=st.sampled_from(sorted(DECODERS)), raw=st.binary(max_size=200))
@example(kind="ClickEvent", raw=b"NaN")
@example(
    kind="ClickEvent", raw=b'{"event_id": "e", "user_id": "u", "item_id": "i", "ts": Infinity}'
)
@example(kind="RankRequest", raw=b"\xff\xfe\x00{")
@example(kind="RankRequest", raw=b'"\\ud800"')
@example(kind="ClickEvent", raw=b"[" * 2000)
def test_decoders_are_total_on_any_bytes(kind: str, raw: bytes) -> None:
    decode(kind, raw)


@PROPERTIES
@given(data=st.data(), kind=st.sampled_from(sorted(DECODERS)))
def test_decoders_are_total_and_agree_with_the_schema(data: Any, kind: str) -> None:
    document = data.draw(documents(kind))
    raw = json.dumps(document, ensure_ascii=False).encode()
    accepted = decode(kind, raw)
    schema_ok = VALIDATORS[kind].is_valid(document)
    if schema_ok and not accepted and beyond_json_schema(kind, document):
        return
    assert schema_ok == accepted, (kind, document)


def beyond_json_schema(kind: str, document: Any) -> bool:
    """The one rule JSON Schema cannot state (it cannot compare two arrays' lengths): a
    RankResult's scores align with its items. The schema file says so in words."""
    return (
        kind == "RankResult"
        and isinstance(document.get("items"), list)
        and isinstance(document.get("scores"), list)
        and len(document["items"]) != len(document["scores"])
    )


@PROPERTIES
@given(value=json_values, name=st.sampled_from(["request_id", "reply_to", "user_id"]))
def test_peek_field_never_raises(value: Any, name: str) -> None:
    raw = json.dumps({name: value}).encode()
    got = peek_field(raw, name)
    assert got is None or (isinstance(got, str) and got == value)


def test_deeply_nested_context_is_refused_with_a_reason() -> None:
    depth = 1100  # orjson refuses nesting deeper than 1024 levels
    context = b'{"a":' * depth + b"{}" + b"}" * depth
    raw = b'{"request_id": "r", "user_id": "u", "items": ["i"], "context": ' + context + b"}"
    try:
        decode_request(raw, DEFAULT_LIMITS.__class__(max_message_bytes=1 << 20))
    except ContractError as exc:
        assert exc.reason == "not_json" and "depth" in str(exc)
    else:  # pragma: no cover - the assertion documents the outcome
        raise AssertionError("a context nested 1,100 levels deep was accepted")
