"""The reply reason codes: one list in Python (schemas.reasons), the same list in the JSON Schema."""

from __future__ import annotations

import jsonschema
import orjson

from schemas import RankResult, decode_result, is_error_reply, json_schema, reason_code, reasons


def test_the_json_schema_names_the_same_codes_as_python() -> None:
    defs = json_schema("RankResult")["$defs"]
    assert set(defs["degraded_reason"]["enum"]) == reasons.DEGRADED_REASONS
    assert set(defs["error_code"]["enum"]) == reasons.ERROR_CODES


def test_codes_are_distinct_and_carry_no_separator() -> None:
    assert not reasons.DEGRADED_REASONS & reasons.ERROR_CODES
    assert all(":" not in code for code in reasons.DEGRADED_REASONS | reasons.ERROR_CODES)


def test_every_code_makes_a_valid_reply_of_its_kind() -> None:
    schema = json_schema("RankResult")
    base = RankResult("r1", "u1", ("a",), (0.5,), "", degraded=True, served_at=1)
    for code in reasons.DEGRADED_REASONS:
        reply = RankResult(**{**_fields(base), "reason": code})
        jsonschema.validate(orjson.loads(reply.to_json()), schema)
        assert reason_code(decode_result(reply.to_json()).reason) == code
        assert not is_error_reply(reply)
    for code in reasons.ERROR_CODES:
        reply = RankResult(**{**_fields(base), "items": (), "scores": (), "reason": f"{code}: x"})
        jsonschema.validate(orjson.loads(reply.to_json()), schema)
        assert reason_code(reply.reason) == code and is_error_reply(reply)


def test_a_normal_reply_and_an_unknown_code_are_not_refusals() -> None:
    assert reason_code(None) is None
    assert not is_error_reply(RankResult("r", "u", (), (), "v"))
    assert not is_error_reply(RankResult("r", "u", (), (), "v", True, "some_new_code: detail"))


def _fields(result: RankResult) -> dict[str, object]:
    return {name: getattr(result, name) for name in result.__slots__}
