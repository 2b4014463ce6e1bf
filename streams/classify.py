"""Sorting one fetched batch of raw click records (pure, no I/O).

``classify`` decodes and validates every record: valid keyed clicks are applied, unkeyed (or
wrongly keyed) ones are forwarded to the clicks topic keyed by user_id (so one user's events
meet on one worker), bad ones become dead letters with a reason. The batch script's arguments
are built from what is applied by :func:`streams.writer.assemble`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from schemas import ClickEvent, DeadLetter, KafkaHeaders, Limits, decode_click
from streamrank.errors import UNDECODABLE_BATCH, ContractError, internal_error
from streamrank.kafka.guard import UndecodableBatch


class Record(NamedTuple):
    """What the worker needs of one consumed Kafka record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_s: float | None = None  # the record's broker/producer timestamp
    headers: KafkaHeaders = ()  # accepted and ignored; copied into dead letters


@dataclass(slots=True)
class Classified:
    """One batch sorted into what to apply, forward and dead-letter."""

    apply: list[ClickEvent] = field(default_factory=list)
    applied_at: list[tuple[str, int, int]] = field(default_factory=list)  # (topic, p, offset)
    forward: list[ClickEvent] = field(default_factory=list)
    forward_raw: list[bytes] = field(default_factory=list)
    forward_headers: list[KafkaHeaders] = field(default_factory=list)
    skipped: int = 0  # offsets of undecodable batches that were skipped (see kafka_guard)
    dead: list[tuple[str, DeadLetter]] = field(default_factory=list)  # (reason, letter)
    in_batch_duplicates: int = 0


def check_skew(event: ClickEvent, now_ms: int, max_skew_s: int) -> None:
    """Refuse an event whose ts is further than ``max_skew_s`` from now, either way."""
    if abs(event.ts - now_ms) > max_skew_s * 1000:
        raise ContractError(
            f"field 'ts' is {event.ts}, more than {max_skew_s}s from now ({now_ms})",
            field="ts",
            reason="ts_out_of_range",
        )


def payload(record: Record) -> bytes:
    """A record's value, or the ContractError that dead-letters it (an undecodable batch, a
    null payload)."""
    if isinstance(record.value, UndecodableBatch):
        raise ContractError(
            record.value.describe(record.topic, record.partition), reason=UNDECODABLE_BATCH
        )
    if record.value is None:
        raise ContractError("message has no value (null payload)", reason="empty")
    return record.value


def classify(
    records: Sequence[Record], *, limits: Limits, now_ms: int, max_skew_s: int
) -> Classified:
    """Decode and validate a batch; duplicates of one (user_id, event_id) within the batch are
    applied once. Keyed like the store's dedupe (per user), so what is applied does not
    depend on how records fell into batches (keyed by event_id alone, two users' clicks that
    share an event_id would both be applied in two batches but one lost in one)."""
    out = Classified()
    seen: set[tuple[str, str]] = set()
    for record in records:
        try:
            if isinstance(record.value, UndecodableBatch):
                out.skipped += record.value.last_offset - record.value.first_offset + 1
            raw = payload(record)
            event = decode_click(raw, limits)
            check_skew(event, now_ms, max_skew_s)
        except Exception as exc:
            # A contract breach, or a bug of ours on input nobody foresaw: either way only this
            # record is dead-lettered, the rest of the batch goes on.
            out.dead.append(dead_letter(record, exc, now_ms))
            continue
        if not record.key or record.key != event.user_id.encode():
            out.forward.append(event)
            out.forward_raw.append(raw)
            out.forward_headers.append(record.headers)
            continue
        identity = (event.user_id, event.event_id)
        if identity in seen:
            out.in_batch_duplicates += 1
            continue
        seen.add(identity)
        out.apply.append(event)
        out.applied_at.append((record.topic, record.partition, record.offset))
    return out


def dead_letter(record: Record, exc: BaseException, now_ms: int) -> tuple[str, DeadLetter]:
    """(reason, dead letter) of a record that could not be applied: its contract reason, or
    ``internal_error`` with the exception's one-line summary for anything unexpected."""
    if not isinstance(exc, ContractError):
        exc = internal_error(exc)
    return exc.reason, DeadLetter.rejected(record, exc, at=now_ms)
