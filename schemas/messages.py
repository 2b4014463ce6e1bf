"""The message contracts as Python types (decoders: :mod:`schemas.decode`).

Every message is a UTF-8 JSON object; the JSON Schema files beside this module
(``*.schema.json``, for producers in other languages) describe the same contract.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

from streamrank.errors import ContractError
from streamrank.settings import LimitSettings

Action = Literal["click", "view", "cart", "purchase"]
ACTIONS: frozenset[str] = frozenset({"click", "view", "cart", "purchase"})


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits of the contract (``settings.limits``: ``max_message_bytes``,
    ``max_items_per_request``, ``max_id_length``)."""

    max_message_bytes: int = 64 * 1024
    max_items: int = 500
    max_id_length: int = 128

    @classmethod
    def from_settings(cls, limits: LimitSettings) -> Limits:
        return cls(
            max_message_bytes=limits.max_message_bytes,
            max_items=limits.max_items_per_request,
            max_id_length=limits.max_id_length,
        )


DEFAULT_LIMITS = Limits()
# The largest event time a message may carry: the last millisecond of year 9999 (the end of
# what a calendar, and Python's datetime, can name); anything beyond is a producer's bug.
MAX_TS_MS = 253_402_300_799_999


@dataclass(frozen=True, slots=True)
class ClickEvent:
    """A user's interaction with an item; topic ``clicks``, key = user_id."""

    event_id: str
    user_id: str
    item_id: str
    ts: int  # event time, epoch ms
    category: str | None = None
    action: Action = "click"

    def to_json(self) -> bytes:
        return orjson.dumps(self)


AttributeValue = str | tuple[str, ...]
MAX_ATTRIBUTES = 32  # names per ItemEvent
MAX_ATTRIBUTE_VALUES = 64  # strings per attribute value


@dataclass(frozen=True, slots=True)
class ItemEvent:
    """An item that appeared or changed; topic ``items``, key = item_id. ``attributes``: name
    -> a string or a list of strings (e.g. ``{"genres": ["Action", "Comedy"]}``)."""

    item_id: str
    category: str | None
    ts: int  # event time, epoch ms: a newer event replaces an older one, never the reverse
    attributes: dict[str, AttributeValue] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps(self)


DEFAULT_SCENE = "default"


@dataclass(frozen=True, slots=True)
class RankRequest:
    """A request to rank items for ``user_id``; topic ``rank-requests``, key = user_id.

    With ``items`` the engine scores those candidates; without (an empty tuple) it retrieves
    candidates itself through the whole cascade. ``top_k`` asks for the best ``top_k`` only,
    sorted best first; ``scene`` selects the per-scene rules; ``exclude`` are items never to
    return."""

    request_id: str
    user_id: str
    items: tuple[str, ...] = ()
    context: dict[str, Any] | None = None
    deadline_ms: int | None = None  # epoch ms; None = the worker's default budget
    reply_to: str | None = None
    ts: int | None = None  # epoch ms: the request's event time; None = the Kafka record's
    top_k: int | None = None  # None: every candidate (items) or the scene's default (retrieval)
    scene: str = DEFAULT_SCENE
    exclude: tuple[str, ...] = ()

    @property
    def retrieves(self) -> bool:
        """Whether the engine must find the candidates (the request brought none)."""
        return not self.items

    def to_json(self) -> bytes:
        """The message; a retrieval request's ``items`` as null (the contract refuses ``[]``)."""
        if self.items:
            return orjson.dumps(self)
        return orjson.dumps({**_fields(self), "items": None})

    def as_of_ms(self, record_ts_ms: int) -> int:
        """The "as of" of every feature of this request (epoch ms): its ``ts``, else the
        timestamp of the Kafka record that carried it."""
        return record_ts_ms if self.ts is None else self.ts


@dataclass(frozen=True, slots=True)
class RankResult:
    """The reply; topic ``rank-results`` (or the request's allowed reply_to), key = request_id."""

    request_id: str
    user_id: str
    items: tuple[str, ...]
    scores: tuple[float, ...]  # aligned with items
    model_version: str
    degraded: bool = False
    reason: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    served_at: int = 0  # epoch ms
    cached: bool = False  # the reply came from the result cache

    def to_json(self) -> bytes:
        return orjson.dumps(self)


def _fields(message: Any) -> dict[str, Any]:
    """A slotted dataclass' fields by name (orjson serialises them in this order)."""
    return {name: getattr(message, name) for name in message.__dataclass_fields__}


KafkaHeaders = Sequence[tuple[str, bytes | None]]  # record headers as Kafka clients give them


class SourceRecord(Protocol):
    """What a dead letter needs of a consumed record (aiokafka's, Faust's, or ours)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> KafkaHeaders: ...


# What a dead letter keeps of its record (it must fit in a Kafka message: ~1 MB by default).
DEAD_LETTER_PAYLOAD_BYTES = 256 * 1024
DEAD_LETTER_HEADER_BYTES = 4 * 1024
DEAD_LETTER_HEADERS = 64
# The most a dead letter can weigh: payload and header values base64-encoded, and the rest.
DEAD_LETTER_MAX_BYTES = (
    DEAD_LETTER_PAYLOAD_BYTES + DEAD_LETTER_HEADERS * DEAD_LETTER_HEADER_BYTES
) * 4 // 3 + 64 * 1024


def _utf8_prefix(raw: bytes, limit: int) -> bytes:
    """The first ``limit`` bytes, less a UTF-8 character cut in two at the end (so text stays
    text)."""
    cut = raw[:limit]
    for trim in range(4):
        try:
            (cut[: len(cut) - trim] if trim else cut).decode("utf-8")
            return cut[: len(cut) - trim] if trim else cut
        except UnicodeDecodeError:
            continue
    return cut  # not text at all: base64 either way


def _text_or_base64(raw: bytes) -> tuple[str, Literal["utf-8", "base64"]]:
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"


def _encode_headers(headers: KafkaHeaders | None) -> tuple[dict[str, Any], ...]:
    out: list[dict[str, Any]] = []
    for key, value in headers or ():
        if value is None:
            out.append({"key": key, "value": None})
            continue
        text, encoding = _text_or_base64(bytes(value))
        entry: dict[str, Any] = {"key": key, "value": text}
        if encoding == "base64":
            entry["encoding"] = "base64"
        out.append(entry)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that could not be processed, with why and where it came from.

    ``headers`` are the original record's headers (a producer's trace ids survive), each
    ``{"key", "value"}`` with the value as UTF-8 text, null, or base64 with ``"encoding":
    "base64"``.
    """

    source_topic: str
    partition: int
    offset: int
    error: str
    payload: str
    at: int  # epoch ms
    payload_encoding: Literal["utf-8", "base64"] = "utf-8"
    headers: tuple[dict[str, Any], ...] = ()

    @classmethod
    def wrap(
        cls,
        raw: bytes | None,
        *,
        source_topic: str,
        partition: int,
        offset: int,
        error: str,
        at: int,
        headers: KafkaHeaders | None = None,
    ) -> DeadLetter:
        """Keep the original bytes (as text when they are valid UTF-8, else base64) and
        headers. A payload over :data:`DEAD_LETTER_PAYLOAD_BYTES` keeps its first bytes only
        (and a header value over :data:`DEAD_LETTER_HEADER_BYTES` likewise; at most
        :data:`DEAD_LETTER_HEADERS` headers), and ``error`` says so: a dead letter must fit in
        a Kafka message, or the worker producing it could never get past it."""
        data = bytes(raw or b"")
        notes: list[str] = []
        if len(data) > DEAD_LETTER_PAYLOAD_BYTES:
            notes.append(
                f"payload truncated to its first {DEAD_LETTER_PAYLOAD_BYTES} of {len(data)} bytes"
            )
            data = _utf8_prefix(data, DEAD_LETTER_PAYLOAD_BYTES)
        kept = list(headers or ())
        if len(kept) > DEAD_LETTER_HEADERS:
            notes.append(f"{len(kept) - DEAD_LETTER_HEADERS} of {len(kept)} headers dropped")
            kept = kept[:DEAD_LETTER_HEADERS]
        if any(v is not None and len(v) > DEAD_LETTER_HEADER_BYTES for _k, v in kept):
            notes.append(f"header values truncated to {DEAD_LETTER_HEADER_BYTES} bytes")
            kept = [(k, v if v is None else _utf8_prefix(bytes(v), DEAD_LETTER_HEADER_BYTES))
                    for k, v in kept]  # fmt: skip
        if notes:
            error = f"{error} ({'; '.join(notes)})"
        text, encoding = _text_or_base64(data)
        return cls(
            source_topic, partition, offset, error, text, at, encoding, _encode_headers(kept)
        )

    @classmethod
    def rejected(cls, record: SourceRecord, exc: ContractError, *, at: int) -> DeadLetter:
        """The dead letter of a consumed record that broke its contract: where it came from, its
        bytes and headers, and ``error`` = "reason: message"."""
        return cls.wrap(
            record.value,
            source_topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            error=f"{exc.reason}: {exc}",
            at=at,
            headers=record.headers,
        )

    @property
    def reason(self) -> str:
        """The machine-readable reason code (the part of ``error`` before the first colon)."""
        return self.error.split(":", 1)[0]

    def original_bytes(self) -> bytes:
        if self.payload_encoding == "base64":
            return base64.b64decode(self.payload)
        return self.payload.encode("utf-8")

    def original_headers(self) -> list[tuple[str, bytes | None]]:
        """The original record's headers, as Kafka clients take them."""
        out: list[tuple[str, bytes | None]] = []
        for header in self.headers:
            value = header["value"]
            if value is not None:
                binary = header.get("encoding") == "base64"
                value = base64.b64decode(value) if binary else value.encode("utf-8")
            out.append((header["key"], value))
        return out

    def to_json(self) -> bytes:
        return orjson.dumps(self)
