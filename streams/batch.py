"""Turning one fetched batch of raw click records into Redis script arguments (pure, no I/O).

``classify`` decodes and validates every record: valid keyed clicks are applied, unkeyed (or
wrongly keyed) ones are forwarded to the clicks topic keyed by user_id (so one user's events
meet on one worker), bad ones become dead letters with a reason. ``assemble`` builds the
arguments of the batch script (``streams/writer.py``): every key is built by ``streamrank.keys``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import orjson

from schemas import ClickEvent, DeadLetter, Limits, decode_click
from schemas.messages import KafkaHeaders
from streamrank import keys
from streamrank.errors import UNDECODABLE_BATCH, ContractError, internal_error
from streamrank.kafka_guard import UndecodableBatch
from streams.windows import Window, bucket_expire_at_ms, bucket_start


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


def classify(
    records: Sequence[Record], *, limits: Limits, now_ms: int, max_skew_s: int
) -> Classified:
    """Decode and validate a batch; duplicates of one event_id within the batch are applied once."""
    out = Classified()
    seen: set[str] = set()
    for record in records:
        try:
            if isinstance(record.value, UndecodableBatch):
                out.skipped += record.value.last_offset - record.value.first_offset + 1
                raise ContractError(
                    record.value.describe(record.topic, record.partition),
                    reason=UNDECODABLE_BATCH,
                )
            if record.value is None:
                raise ContractError("message has no value (null payload)", reason="empty")
            event = decode_click(record.value, limits)
            check_skew(event, now_ms, max_skew_s)
        except Exception as exc:
            # A contract breach, or a bug of ours on input nobody foresaw: either way only this
            # record is dead-lettered, the rest of the batch goes on.
            out.dead.append(dead_letter(record, exc, now_ms))
            continue
        if not record.key or record.key != event.user_id.encode():
            out.forward.append(event)
            out.forward_raw.append(record.value)
            out.forward_headers.append(record.headers)
            continue
        if event.event_id in seen:
            out.in_batch_duplicates += 1
            continue
        seen.add(event.event_id)
        out.apply.append(event)
    return out


def dead_letter(record: Record, exc: BaseException, now_ms: int) -> tuple[str, DeadLetter]:
    """(reason, dead letter) of a record that could not be applied: its contract reason, or
    ``internal_error`` with the exception's one-line summary for anything unexpected."""
    if not isinstance(exc, ContractError):
        exc = internal_error(exc)
    letter = DeadLetter.rejected(
        record.value,
        exc,
        source_topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        at=now_ms,
        headers=record.headers,
    )
    return exc.reason, letter


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """Keys and the one argument of one run of the batch script, plus what it skipped."""

    keys: list[str]
    payload: bytes
    too_old_for_counters: int


def assemble(
    events: Sequence[ClickEvent],
    *,
    now_ms: int,
    windows: tuple[Window, Window],
    lateness_s: int,
    sequence_length: int,
    sequence_ttl_s: int,
    dedupe_ttl_s: int,
) -> ScriptCall:
    """Arguments of the batch script for ``events`` (already validated and unique by event_id).

    KEYS = seen keys (one per event), then sequence keys (one per distinct user), then counter
    bucket keys (one per distinct bucket). ARGV[1] = one JSON document (one argument instead of
    nine per event: redis-py packs each argument in Python, which cost more than the rest of
    the batch): ``n`` = [events, users, buckets], ``h`` = [cap, sequence TTL ms, dedupe TTL ms],
    ``x`` = PEXPIREAT time (ms) per bucket key, ``e`` = per event [user index, score, member,
    user fine, user coarse, item fine, item coarse bucket index (0 = not counted: the bucket
    has already expired), item id, category field or ""]. Integers that may exceed Lua's
    14 significant digits travel as strings.
    """
    fine, coarse = windows
    seen_keys: list[str] = []
    user_index: dict[str, int] = {}
    bucket_index: dict[str, int] = {}
    bucket_expiry: list[str] = []
    per_event: list[list[str | int]] = []
    too_old = 0

    def bucket(key: str, expire_at_ms: int) -> int:
        index = bucket_index.get(key)
        if index is None:
            index = bucket_index[key] = len(bucket_index) + 1
            bucket_expiry.append(str(expire_at_ms))
        return index

    for event in events:
        seen_keys.append(keys.seen(event.event_id))
        uidx = user_index.get(event.user_id)
        if uidx is None:
            uidx = user_index[event.user_id] = len(user_index) + 1
        fine_start = bucket_start(event.ts, fine.resolution_s)
        coarse_start = bucket_start(event.ts, coarse.resolution_s)
        fine_exp = bucket_expire_at_ms(fine_start, fine, lateness_s)
        coarse_exp = bucket_expire_at_ms(coarse_start, coarse, lateness_s)
        ufine = ifine = ucoarse = icoarse = 0
        if fine_exp > now_ms:
            ufine = bucket(
                keys.user_counter_bucket(event.user_id, fine.resolution_s, fine_start), fine_exp
            )
            ifine = bucket(keys.item_counter_bucket(fine.resolution_s, fine_start), fine_exp)
        if coarse_exp > now_ms:
            ucoarse = bucket(
                keys.user_counter_bucket(event.user_id, coarse.resolution_s, coarse_start),
                coarse_exp,
            )
            icoarse = bucket(
                keys.item_counter_bucket(coarse.resolution_s, coarse_start), coarse_exp
            )
        else:
            too_old += 1
        per_event.append(
            [
                uidx,
                str(event.ts),
                keys.sequence_member(event.event_id, event.item_id, event.category),
                ufine,
                ucoarse,
                ifine,
                icoarse,
                event.item_id,
                keys.category_field(event.category) if event.category else "",
            ]
        )
    all_keys = seen_keys + [keys.sequence(u) for u in user_index] + list(bucket_index)
    payload = orjson.dumps(
        {
            "n": [len(seen_keys), len(user_index), len(bucket_index)],
            "h": [sequence_length, str(sequence_ttl_s * 1000), str(dedupe_ttl_s * 1000)],
            "x": bucket_expiry,
            "e": per_event,
        }
    )
    return ScriptCall(all_keys, payload, too_old)
