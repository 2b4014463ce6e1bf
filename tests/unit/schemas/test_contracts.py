"""The Python decoders and the JSON Schema files accept and reject the same messages."""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest

from schemas import (
    DEFAULT_LIMITS,
    MAX_TS_MS,
    ClickEvent,
    DeadLetter,
    ItemEvent,
    Limits,
    RankRequest,
    RankResult,
    decode_click,
    decode_dead_letter,
    decode_item,
    decode_request,
    decode_result,
    json_schema,
    peek_request_id,
)
from streamrank.errors import ContractError

CLICK: dict[str, Any] = {
    "event_id": "e1",
    "user_id": "u1",
    "item_id": "i1",
    "category": "drama",
    "action": "view",
    "ts": 1_700_000_000_000,
}
REQUEST: dict[str, Any] = {
    "request_id": "r1",
    "user_id": "u1",
    "items": ["a", "b"],
    "context": {"page": "home"},
    "deadline_ms": 1_700_000_000_050,
    "reply_to": "my-replies",
    "ts": 1_700_000_000_000,
}
RESULT: dict[str, Any] = {
    "request_id": "r1",
    "user_id": "u1",
    "items": ["a", "b"],
    "scores": [0.5, 0.25],
    "model_version": "din-x",
    "degraded": False,
    "reason": None,
    "timings_ms": {"total": 3.5},
    "served_at": 1_700_000_000_010,
}
ITEM: dict[str, Any] = {
    "item_id": "m1",
    "category": "Action|Comedy",
    "attributes": {"genres": ["Action", "Comedy"], "year": "1995"},
    "ts": 1_700_000_000_000,
}
LETTER: dict[str, Any] = {
    "source_topic": "clicks",
    "partition": 2,
    "offset": 17,
    "error": "bad",
    "payload": "{}",
    "at": 1,
}


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if value is _DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


_DROP = object()
LONG = "x" * (DEFAULT_LIMITS.max_id_length + 1)

# (message type, document, valid?)
CORPUS: list[tuple[str, Any, bool]] = [
    ("ClickEvent", CLICK, True),
    ("ClickEvent", with_(CLICK, category=None, action=_DROP), True),
    ("ClickEvent", with_(CLICK, category=_DROP), True),
    ("ClickEvent", with_(CLICK, extra_field={"a": 1}), True),
    ("ClickEvent", with_(CLICK, ts=1.7e12), True),
    ("ClickEvent", with_(CLICK, ts="1700000000000"), False),
    ("ClickEvent", with_(CLICK, ts=1.5), False),
    ("ClickEvent", with_(CLICK, ts=-1), False),
    ("ClickEvent", with_(CLICK, ts=True), False),
    ("ClickEvent", with_(CLICK, ts=None), False),
    ("ClickEvent", with_(CLICK, ts=_DROP), False),
    ("ClickEvent", with_(CLICK, event_id=_DROP), False),
    ("ClickEvent", with_(CLICK, user_id=7), False),
    ("ClickEvent", with_(CLICK, user_id=""), False),
    ("ClickEvent", with_(CLICK, item_id=LONG), False),
    ("ClickEvent", with_(CLICK, item_id="a\x1fb"), False),
    ("ClickEvent", with_(CLICK, category=3), False),
    ("ClickEvent", with_(CLICK, action="like"), False),
    ("ClickEvent", with_(CLICK, action=None), False),
    ("ClickEvent", with_(CLICK, action={}), False),  # once a TypeError that crashed the worker
    ("ClickEvent", with_(CLICK, action=["click"]), False),
    ("ClickEvent", with_(CLICK, action=1), False),
    ("ClickEvent", [CLICK], False),
    ("ClickEvent", "click", False),
    ("ClickEvent", {"user_id": "ü-ñ", "event_id": "é", "item_id": "漢字", "ts": 0}, True),
    ("RankRequest", REQUEST, True),
    ("RankRequest", with_(REQUEST, context=None, deadline_ms=None, reply_to=None), True),
    ("RankRequest", with_(REQUEST, context=_DROP, deadline_ms=_DROP, reply_to=_DROP), True),
    ("RankRequest", with_(REQUEST, items=["a"] * DEFAULT_LIMITS.max_items), True),
    ("RankRequest", with_(REQUEST, items=["a"] * (DEFAULT_LIMITS.max_items + 1)), False),
    ("RankRequest", with_(REQUEST, items=[]), False),
    ("RankRequest", with_(REQUEST, items="a,b"), False),
    ("RankRequest", with_(REQUEST, items=["a", 2]), False),
    ("RankRequest", with_(REQUEST, items=["a", LONG]), False),
    ("RankRequest", with_(REQUEST, items=_DROP), True),  # retrieval: the engine finds them
    ("RankRequest", with_(REQUEST, items=None), True),
    ("RankRequest", with_(REQUEST, items=None, top_k=10, scene="home", exclude=["a"]), True),
    ("RankRequest", with_(REQUEST, top_k=DEFAULT_LIMITS.max_items), True),
    ("RankRequest", with_(REQUEST, top_k=DEFAULT_LIMITS.max_items + 1), False),
    ("RankRequest", with_(REQUEST, top_k=0), False),
    ("RankRequest", with_(REQUEST, top_k=None, scene=None, exclude=None), True),
    ("RankRequest", with_(REQUEST, top_k="10"), False),
    ("RankRequest", with_(REQUEST, top_k=2.5), False),
    ("RankRequest", with_(REQUEST, scene=""), False),
    ("RankRequest", with_(REQUEST, scene=3), False),
    ("RankRequest", with_(REQUEST, scene="a\x1fb"), False),
    ("RankRequest", with_(REQUEST, exclude=[]), True),
    ("RankRequest", with_(REQUEST, exclude="a"), False),
    ("RankRequest", with_(REQUEST, exclude=["a", LONG]), False),
    ("RankRequest", with_(REQUEST, exclude=["a"] * (DEFAULT_LIMITS.max_items + 1)), False),
    ("RankRequest", with_(REQUEST, request_id=_DROP), False),
    ("RankRequest", with_(REQUEST, context=[1]), False),
    ("RankRequest", with_(REQUEST, deadline_ms="soon"), False),
    ("RankRequest", with_(REQUEST, deadline_ms=-5), False),
    ("RankRequest", with_(REQUEST, reply_to=""), False),
    ("RankRequest", with_(REQUEST, ts=None), True),
    ("RankRequest", with_(REQUEST, ts=_DROP), True),
    ("RankRequest", with_(REQUEST, ts=0), True),
    ("RankRequest", with_(REQUEST, ts=1.7e12), True),
    ("RankRequest", with_(REQUEST, ts=MAX_TS_MS), True),
    ("RankRequest", with_(REQUEST, ts=MAX_TS_MS + 1), False),
    ("RankRequest", with_(REQUEST, ts=1.5e300), False),
    ("RankRequest", with_(REQUEST, ts=-1), False),
    ("RankRequest", with_(REQUEST, ts=1.5), False),
    ("RankRequest", with_(REQUEST, ts="1700000000000"), False),
    ("RankRequest", with_(REQUEST, ts=True), False),
    ("RankRequest", with_(REQUEST, ts=[1]), False),
    ("RankResult", RESULT, True),
    ("RankResult", with_(RESULT, degraded=True, reason="expired", scores=[0, 1]), True),
    ("RankResult", with_(RESULT, scores=["0.5", 0.1]), False),
    ("RankResult", with_(RESULT, degraded="no"), False),
    ("RankResult", with_(RESULT, served_at=_DROP), False),
    ("RankResult", with_(RESULT, timings_ms=[]), False),
    ("RankResult", with_(RESULT, cached=True), True),
    ("RankResult", with_(RESULT, cached=_DROP), True),
    ("RankResult", with_(RESULT, cached="yes"), False),
    ("ItemEvent", ITEM, True),
    ("ItemEvent", with_(ITEM, category=None, attributes=None), True),
    ("ItemEvent", with_(ITEM, category=_DROP, attributes=_DROP), True),
    ("ItemEvent", with_(ITEM, attributes={}), True),
    ("ItemEvent", with_(ITEM, attributes={"genres": []}), True),
    ("ItemEvent", with_(ITEM, attributes={f"a{i}": "x" for i in range(32)}), True),
    ("ItemEvent", with_(ITEM, attributes={f"a{i}": "x" for i in range(33)}), False),
    ("ItemEvent", with_(ITEM, attributes={"genres": ["x"] * 64}), True),
    ("ItemEvent", with_(ITEM, attributes={"genres": ["x"] * 65}), False),
    ("ItemEvent", with_(ITEM, attributes={"genres": ["Action", 3]}), False),
    ("ItemEvent", with_(ITEM, attributes={"genres": [["Action"]]}), False),
    ("ItemEvent", with_(ITEM, attributes={"genres": ""}), False),
    ("ItemEvent", with_(ITEM, attributes={"genres": "a\x1fb"}), False),
    ("ItemEvent", with_(ITEM, attributes={"": "x"}), False),
    ("ItemEvent", with_(ITEM, attributes={LONG: "x"}), False),
    ("ItemEvent", with_(ITEM, attributes={"year": 1995}), False),
    ("ItemEvent", with_(ITEM, attributes={"year": None}), False),
    ("ItemEvent", with_(ITEM, attributes=["genres"]), False),
    ("ItemEvent", with_(ITEM, attributes="Action"), False),
    ("ItemEvent", with_(ITEM, category=""), False),
    ("ItemEvent", with_(ITEM, category=["Action"]), False),
    ("ItemEvent", with_(ITEM, item_id=_DROP), False),
    ("ItemEvent", with_(ITEM, item_id=LONG), False),
    ("ItemEvent", with_(ITEM, ts=_DROP), False),
    ("ItemEvent", with_(ITEM, ts=None), False),
    ("ItemEvent", with_(ITEM, ts=-1), False),
    ("ItemEvent", with_(ITEM, ts=MAX_TS_MS + 1), False),
    ("ItemEvent", with_(ITEM, ts=1.7e12), True),
    ("ItemEvent", [ITEM], False),
    ("DeadLetter", LETTER, True),
    ("DeadLetter", with_(LETTER, payload_encoding="base64", payload="AAE="), True),
    ("DeadLetter", with_(LETTER, payload_encoding="hex"), False),
    ("DeadLetter", with_(LETTER, offset=-1), False),
    ("DeadLetter", with_(LETTER, error=_DROP), False),
]

DECODERS = {
    "ClickEvent": decode_click,
    "RankRequest": decode_request,
    "RankResult": decode_result,
    "DeadLetter": decode_dead_letter,
    "ItemEvent": decode_item,
}


@pytest.mark.parametrize(("kind", "document", "valid"), CORPUS)
def test_python_types_and_json_schema_agree(kind: str, document: Any, valid: bool) -> None:
    schema = json_schema(kind)
    jsonschema.Draft202012Validator.check_schema(schema)
    schema_ok = jsonschema.Draft202012Validator(schema).is_valid(document)
    try:
        DECODERS[kind](orjson.dumps(document))
        python_ok = True
    except ContractError:
        python_ok = False
    assert (schema_ok, python_ok) == (valid, valid)


def test_errors_name_the_field_and_the_problem() -> None:
    with pytest.raises(ContractError, match=r"field 'ts' must be an integer, got string") as info:
        decode_click(orjson.dumps(with_(CLICK, ts="x")))
    assert info.value.field == "ts"
    assert info.value.reason == "bad_type"
    with pytest.raises(ContractError, match=r"field 'event_id' is missing") as info:
        decode_click(orjson.dumps(with_(CLICK, event_id=_DROP)))
    assert info.value.reason == "missing_field"
    with pytest.raises(
        ContractError, match=r"field 'items\[1\]' is 129 characters, over the limit of 128"
    ):
        decode_request(orjson.dumps(with_(REQUEST, items=["a", LONG])))
    with pytest.raises(ContractError, match="not valid UTF-8 JSON") as info:
        decode_click(b"\xff\xfe{")
    assert info.value.reason == "not_json"


def test_decoders_apply_settings_limits() -> None:
    tight = Limits(max_message_bytes=300, max_items=2, max_id_length=4)
    with pytest.raises(ContractError, match="over the limit of 300") as info:
        decode_click(orjson.dumps(with_(CLICK, pad="x" * 400)), tight)
    assert info.value.reason == "too_large"
    with pytest.raises(ContractError, match="3 entries, over the limit of 2"):
        decode_request(orjson.dumps(with_(REQUEST, items=["a", "b", "c"], reply_to=None)), tight)
    with pytest.raises(ContractError, match="over the limit of 4"):
        decode_click(orjson.dumps(with_(CLICK, event_id="abcde")), tight)


def test_decoded_values_round_trip_through_json() -> None:
    click = decode_click(orjson.dumps(with_(CLICK, action=_DROP, category=_DROP)))
    assert click == ClickEvent(event_id="e1", user_id="u1", item_id="i1", ts=1_700_000_000_000)
    assert decode_click(click.to_json()) == click
    request = decode_request(orjson.dumps(REQUEST))
    assert request.items == ("a", "b") and request.deadline_ms == 1_700_000_000_050
    assert request.ts == 1_700_000_000_000
    assert decode_request(request.to_json()) == request
    bare = decode_request(orjson.dumps(with_(REQUEST, ts=_DROP)))
    assert bare.ts is None and decode_request(bare.to_json()) == bare
    result = decode_result(orjson.dumps(RESULT))
    assert decode_result(result.to_json()) == result
    assert isinstance(result, RankResult)


def test_a_retrieval_request_round_trips_with_null_items() -> None:
    retrieval = RankRequest("r1", "u1", top_k=5, scene="home", exclude=("a",))
    assert orjson.loads(retrieval.to_json())["items"] is None  # `[]` would be refused
    assert decode_request(retrieval.to_json()) == retrieval and retrieval.retrieves
    jsonschema.validate(orjson.loads(retrieval.to_json()), json_schema("RankRequest"))


def test_dead_letter_keeps_the_original_bytes() -> None:
    text = DeadLetter.wrap(
        b'{"oops"', source_topic="clicks", partition=1, offset=9, error="e", at=5
    )
    assert text.payload_encoding == "utf-8" and text.original_bytes() == b'{"oops"'
    binary = DeadLetter.wrap(
        b"\xff\x00\x01", source_topic="clicks", partition=1, offset=9, error="e", at=5
    )
    assert binary.payload_encoding == "base64" and binary.original_bytes() == b"\xff\x00\x01"
    assert decode_dead_letter(binary.to_json()) == binary
    jsonschema.validate(orjson.loads(binary.to_json()), json_schema("DeadLetter"))


def test_peek_request_id_reads_what_it_can() -> None:
    assert peek_request_id(b'{"request_id": "r9", "items": 5}') == "r9"
    assert peek_request_id(b"not json") is None
    assert peek_request_id(b'{"request_id": 5}') is None
    assert peek_request_id(None) is None


def test_a_dead_letter_of_a_huge_record_keeps_its_head_and_says_so() -> None:
    """A dead letter must fit in a Kafka message, or the worker producing it would retry it
    for ever (seen with a 10 MB click: the features worker stopped applying anything)."""
    from schemas.messages import DEAD_LETTER_HEADER_BYTES, DEAD_LETTER_PAYLOAD_BYTES

    raw = ("é" * (6 << 20)).encode()  # 12 MB of two-byte characters
    headers = [("trace", b"t"), ("big", b"x" * 100_000)] + [(f"h{i}", b"v") for i in range(100)]
    letter = DeadLetter.wrap(raw, source_topic="clicks", partition=1, offset=7,
                             error="too_large: message is 12582912 bytes", at=1,
                             headers=headers)  # fmt: skip
    assert letter.reason == "too_large"
    assert letter.payload_encoding == "utf-8"  # cut between characters, still text
    assert len(letter.original_bytes()) <= DEAD_LETTER_PAYLOAD_BYTES
    assert raw.startswith(letter.original_bytes())
    assert f"first {DEAD_LETTER_PAYLOAD_BYTES} of {len(raw)} bytes" in letter.error
    assert "headers dropped" in letter.error and "header values truncated" in letter.error
    kept = letter.original_headers()
    assert kept[0] == ("trace", b"t") and len(kept[1][1] or b"") == DEAD_LETTER_HEADER_BYTES
    assert len(letter.to_json()) < 1024 * 1024
    small = DeadLetter.wrap(b"\xff\x00", source_topic="c", partition=0, offset=0, error="e", at=1)
    assert small.original_bytes() == b"\xff\x00" and small.error == "e"


def test_an_error_reply_never_carries_an_id_over_the_limit() -> None:
    from schemas import peek_request_id

    assert peek_request_id(orjson.dumps({"request_id": "r" * 128})) == "r" * 128
    assert peek_request_id(orjson.dumps({"request_id": "r" * 129})) is None
    assert peek_request_id(orjson.dumps({"request_id": "r" * 200}), max_length=200) == "r" * 200


def test_request_ts_is_checked_and_names_its_reason() -> None:
    for bad, reason in ((-1, "bad_value"), (MAX_TS_MS + 1, "bad_value"), ("soon", "bad_type"),
                        (False, "bad_type"), (2.5, "bad_type")):  # fmt: skip
        with pytest.raises(ContractError, match="field 'ts' must be") as info:
            decode_request(orjson.dumps(with_(REQUEST, ts=bad)))
        assert (info.value.field, info.value.reason) == ("ts", reason)
    assert decode_request(orjson.dumps(with_(REQUEST, ts=1.7e12))).ts == 1_700_000_000_000


def test_as_of_is_the_request_ts_else_the_record_timestamp() -> None:
    timed = RankRequest("r", "u", ("a",), ts=1_000)
    untimed = RankRequest("r", "u", ("a",))
    assert timed.as_of_ms(5_000) == 1_000
    assert untimed.as_of_ms(5_000) == 5_000
    assert RankRequest("r", "u", ("a",), ts=0).as_of_ms(5_000) == 0  # 0 is a time, not "none"


def test_a_request_without_items_asks_for_retrieval_with_its_scene_and_top_k() -> None:
    request = decode_request(
        orjson.dumps(with_(REQUEST, items=_DROP, top_k=5, scene="home", exclude=["x", "y"]))
    )
    assert request.retrieves and request.items == ()
    assert (request.top_k, request.scene, request.exclude) == (5, "home", ("x", "y"))
    plain = decode_request(orjson.dumps(REQUEST))
    assert not plain.retrieves
    assert (plain.top_k, plain.scene, plain.exclude) == (None, "default", ())


def test_an_empty_items_list_says_how_to_ask_for_retrieval() -> None:
    with pytest.raises(ContractError, match="omit it, or send null") as err:
        decode_request(orjson.dumps(with_(REQUEST, items=[])))
    assert err.value.reason == "empty_items"


def test_a_cached_reply_round_trips() -> None:
    result = decode_result(orjson.dumps(with_(RESULT, cached=True)))
    assert result.cached
    assert decode_result(result.to_json()) == result
    assert not decode_result(orjson.dumps(RESULT)).cached


def test_an_item_event_round_trips_with_its_attributes() -> None:
    item = decode_item(orjson.dumps(ITEM))
    assert item == ItemEvent(
        "m1", "Action|Comedy", 1_700_000_000_000, {"genres": ("Action", "Comedy"), "year": "1995"}
    )
    assert decode_item(item.to_json()) == item
    jsonschema.validate(orjson.loads(item.to_json()), json_schema("ItemEvent"))
    bare = decode_item(orjson.dumps({"item_id": "m2", "ts": 5}))
    assert bare == ItemEvent("m2", None, 5) and bare.attributes == {}


def test_item_event_errors_name_the_attribute() -> None:
    with pytest.raises(ContractError, match=r"field 'attributes.genres\[1\]' must be a string"):
        decode_item(orjson.dumps(with_(ITEM, attributes={"genres": ["a", 2]})))
    with pytest.raises(ContractError, match="65 values, over the limit of 64") as info:
        decode_item(orjson.dumps(with_(ITEM, attributes={"genres": ["x"] * 65})))
    assert info.value.reason == "too_many_items"
