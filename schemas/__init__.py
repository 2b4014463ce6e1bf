"""Message contracts: Python types (``schemas.messages``), their decoders (``schemas.decode``), the
reply reason codes (``schemas.reasons``) and JSON Schema files (``*.schema.json``)."""

from importlib.resources import files
from typing import Any

import orjson

from schemas import reasons
from schemas.decode import (
    decode_click,
    decode_dead_letter,
    decode_item,
    decode_request,
    decode_result,
    peek_field,
    peek_request_id,
)
from schemas.messages import (
    DEFAULT_LIMITS,
    DEFAULT_SCENE,
    MAX_TS_MS,
    ClickEvent,
    DeadLetter,
    ItemEvent,
    KafkaHeaders,
    Limits,
    RankRequest,
    RankResult,
)
from schemas.reasons import is_error_reply, reason_code

SCHEMA_FILES = {
    "ClickEvent": "click_event.schema.json",
    "RankRequest": "rank_request.schema.json",
    "RankResult": "rank_result.schema.json",
    "DeadLetter": "dead_letter.schema.json",
    "ItemEvent": "item_event.schema.json",
}


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of one message type, by type name (e.g. ``"ClickEvent"``)."""
    schema: dict[str, Any] = orjson.loads(files(__name__).joinpath(SCHEMA_FILES[name]).read_bytes())
    return schema


__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_SCENE",
    "MAX_TS_MS",
    "SCHEMA_FILES",
    "ClickEvent",
    "DeadLetter",
    "ItemEvent",
    "KafkaHeaders",
    "Limits",
    "RankRequest",
    "RankResult",
    "decode_click",
    "decode_dead_letter",
    "decode_item",
    "decode_request",
    "decode_result",
    "is_error_reply",
    "json_schema",
    "peek_field",
    "peek_request_id",
    "reason_code",
    "reasons",
]
