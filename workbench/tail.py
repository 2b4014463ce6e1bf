"""``streamrank tail TOPIC``: read any topic of ours as a table or JSON lines, never as a member
of a consumer group (partitions are assigned, so no worker loses one to an analyst).

Pure parts (tested without a broker): where to start (:class:`Start`), what a message is
(:class:`Message`, total over arbitrary bytes), the filters (:class:`Filters`) and the
formatting (:func:`table_row`, :func:`json_line`). :func:`tail` is the thin reading shell.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas import reason_code
from streamrank import clock
from streamrank.errors import StreamrankError
from streamrank.kafka import clients as kafka
from streamrank.kafka.guard import UndecodableBatch
from streamrank.settings import Settings

Kind = Literal["results", "requests", "clicks", "dead_letters", "served", "other"]
StartKind = Literal["last", "beginning", "end", "since", "offset"]
DEFAULT_LAST = 10
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds of ``90``, ``30s``, ``10m``, ``2h`` or ``1d``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise ValueError(f"{text!r} is not a duration: use e.g. 30s, 10m, 2h or 1d")
    return float(match[1]) * _UNITS[match[2] or "s"]


@dataclass(frozen=True, slots=True)
class Start:
    """Where reading starts in each partition."""

    kind: StartKind = "last"
    value: float = DEFAULT_LAST  # last: records per partition; since: seconds; offset: offset

    def position(self, begin: int, end: int, by_time: int | None = None) -> int:
        """The first offset to read, given the partition's first and next offsets (and, for
        ``since``, the offset the broker found for that time: None = nothing that recent)."""
        if self.kind == "beginning":
            return begin
        if self.kind == "end":
            return end
        if self.kind == "since":
            return end if by_time is None else max(begin, by_time)
        if self.kind == "offset":
            return min(max(begin, int(self.value)), end)
        return max(begin, end - int(self.value))


def kind_of(topic: str, settings: Settings) -> Kind:
    """Which of our message kinds a topic carries (by the topic settings)."""
    known: dict[str, Kind] = {
        settings.topics.results: "results",
        settings.topics.requests: "requests",
        settings.topics.clicks: "clicks",
        settings.topics.dead_letters: "dead_letters",
    }
    for reply_topic in settings.topics.reply_allowed:
        known.setdefault(reply_topic, "results")
    if settings.topics.served_log:
        known.setdefault(settings.topics.served_log, "served")
    return known.get(topic, "other")


def escaped(raw: bytes, limit: int | None = None) -> str:
    """Bytes shown safely on a terminal: invalid UTF-8 as ``\\xNN``, control characters escaped."""
    text = raw.decode("utf-8", "backslashreplace")
    text = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m[0]):02x}", text)
    if limit is not None and len(text) > limit:
        return text[: limit - 1] + "…"
    return text


@dataclass(frozen=True, slots=True)
class Message:
    """One record as tail sees it: the parsed JSON value, or why there is none."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # epoch ms (the record's)
    key: bytes | None
    raw: bytes
    value: Any = None  # the JSON value, when the payload is JSON
    error: str | None = None  # why there is no value (not JSON, undecodable batch)

    @classmethod
    def from_record(cls, record: Any) -> Message:
        raw = record.value
        base = (record.topic, record.partition, record.offset, int(record.timestamp or 0),
                record.key)  # fmt: skip
        if isinstance(raw, UndecodableBatch):
            return cls(*base, bytes(raw), error=raw.describe(record.topic, record.partition))
        raw = bytes(raw or b"")
        try:
            return cls(*base, raw, value=orjson.loads(raw))
        except orjson.JSONDecodeError as exc:
            return cls(*base, raw, error=f"not JSON: {exc}")

    def fields(self) -> dict[str, Any]:
        """The fields the filters and the table read, whatever the message kind; for a dead
        letter, those of the original payload when it is JSON, plus its reason."""
        value = self.value if isinstance(self.value, dict) else {}
        out = dict(value)
        if "source_topic" in value and "error" in value:  # a dead letter
            out["reason"] = str(value.get("error", "")).split(":", 1)[0]
            try:
                original = orjson.loads(str(value.get("payload", "")))
            except orjson.JSONDecodeError:
                original = None
            if isinstance(original, dict):
                for name in ("user_id", "request_id", "event_id", "model_version"):
                    out.setdefault(name, original.get(name))
        return out


@dataclass(frozen=True, slots=True)
class Filters:
    """What a message must match to be shown (unset = anything)."""

    user: str | None = None
    request_id: str | None = None
    model_version: str | None = None
    degraded: bool = False  # only degraded replies
    reason: str | None = None  # prefix of the reply's or dead letter's reason
    min_score: float | None = None  # a result's best score at least this

    def active(self) -> bool:
        optional = (self.user, self.request_id, self.model_version, self.reason, self.min_score)
        return self.degraded or any(v is not None for v in optional)

    def match(self, message: Message) -> bool:
        if not self.active():
            return True
        f = message.fields()
        if self.user is not None and f.get("user_id") != self.user:
            return False
        if self.request_id is not None and f.get("request_id") != self.request_id:
            return False
        if self.model_version is not None and f.get("model_version") != self.model_version:
            return False
        if self.degraded and f.get("degraded") is not True:
            return False
        if self.reason is not None and not str(f.get("reason") or "").startswith(self.reason):
            return False
        if self.min_score is not None:
            scores = [s for s in f.get("scores") or () if isinstance(s, int | float)]
            if not scores or max(scores) < self.min_score:
                return False
        return True


# --- formatting ------------------------------------------------------------------------------

Column = tuple[str, int]  # (header, width)
COLUMNS: dict[Kind, tuple[Column, ...]] = {
    "results": (("time", 12), ("p:offset", 9), ("request_id", 20), ("user", 12),
                ("model", 22), ("flag", 34), ("ms", 7), ("top items (score) | stage ms", 0)),
    "requests": (("time", 12), ("p:offset", 9), ("request_id", 20), ("user", 12),
                 ("items", 5), ("top_k", 5), ("scene", 12), ("deadline", 12), ("reply_to", 0)),
    "clicks": (("time", 12), ("p:offset", 9), ("event_id", 24), ("user", 12), ("item", 14),
               ("category", 14), ("action", 0)),
    "dead_letters": (("time", 12), ("p:offset", 9), ("source", 28), ("reason", 18),
                     ("payload", 0)),
    "served": (("time", 12), ("p:offset", 9), ("request_id", 20), ("user", 12),
               ("model", 22), ("details", 0)),
    "other": (("time", 12), ("p:offset", 9), ("key", 16), ("value", 0)),
}  # fmt: skip
_UNREADABLE: tuple[Column, ...] = (("time", 12), ("p:offset", 9), ("why", 0), ("payload", 0))


def _clip(text: str, width: int) -> str:
    if width <= 0:
        return text
    return text if len(text) <= width else text[: width - 1] + "…"


def header(kind: Kind) -> str:
    return "  ".join(_clip(name, w).ljust(w) for name, w in COLUMNS[kind]).rstrip()


def _time(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


def top_items(items: Sequence[Any], scores: Sequence[Any], k: int) -> str:
    pairs = [(s, i) for i, s in zip(items, scores, strict=False) if isinstance(s, int | float)]
    ranked = sorted(pairs, key=lambda p: -p[0])[:k]
    more = f" (+{len(pairs) - k})" if len(pairs) > k else ""
    return " ".join(f"{i} {s:.4f}" for s, i in ranked) + more


def result_flag(v: dict[str, Any]) -> str:
    """``ok`` or ``degraded <reason code>``, and ``cached`` for a reply from the result cache."""
    flag = f"degraded {reason_code(str(v.get('reason') or ''))}" if v.get("degraded") else "ok"
    return f"{flag} cached" if v.get("cached") is True else flag


def _ms(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def stage_times(timings: dict[str, Any]) -> str:
    """The per-stage timings of a reply but the total, after the items: `` | rank 3.0 ...``."""
    stages = " ".join(f"{k} {_ms(t)}" for k, t in timings.items() if k != "total")
    return f" | {stages}" if stages else ""


def cells(kind: Kind, m: Message, *, top: int = 5) -> list[str]:
    """The column values of one message (before clipping)."""
    where = f"{m.partition}:{m.offset}"
    if m.error is not None:  # shown, escaped, whatever the topic
        return [_time(m.timestamp), where, f"<{m.error}>", escaped(m.raw, 200)]
    v = m.value if isinstance(m.value, dict) else {}
    if kind == "results":
        found = v.get("timings_ms")
        timings: dict[str, Any] = found if isinstance(found, dict) else {}
        return [_time(m.timestamp), where, str(v.get("request_id")), str(v.get("user_id")),
                str(v.get("model_version") or "-"), result_flag(v), _ms(timings.get("total")),
                top_items(v.get("items") or (), v.get("scores") or (), top)
                + stage_times(timings)]  # fmt: skip
    if kind == "requests":
        deadline, items = v.get("deadline_ms"), v.get("items")
        return [_time(m.timestamp), where, str(v.get("request_id")), str(v.get("user_id")),
                str(len(items)) if isinstance(items, list) and items else "-",
                str(v.get("top_k") or "-"), str(v.get("scene") or "default"),
                _time(int(deadline)) if isinstance(deadline, int) else "-",
                str(v.get("reply_to") or "-")]  # fmt: skip
    if kind == "clicks":
        return [_time(m.timestamp), where, str(v.get("event_id")), str(v.get("user_id")),
                str(v.get("item_id")), str(v.get("category") or "-"),
                str(v.get("action") or "click")]  # fmt: skip
    if kind == "dead_letters":
        source = f"{v.get('source_topic')}[{v.get('partition')}]@{v.get('offset')}"
        reason = str(v.get("error", "")).split(":", 1)[0]
        return [_time(m.timestamp), where, source, reason,
                escaped(str(v.get("payload", "")).encode(), 120)]  # fmt: skip
    if kind == "served":
        rest = {k: x for k, x in v.items() if k not in ("request_id", "user_id", "model_version")}
        return [_time(m.timestamp), where, str(v.get("request_id")), str(v.get("user_id")),
                str(v.get("model_version") or "-"), escaped(orjson.dumps(rest), 160)]  # fmt: skip
    key = escaped(m.key, 40) if m.key is not None else "-"
    return [_time(m.timestamp), where, key, escaped(m.raw, 200)]


def table_row(kind: Kind, m: Message, *, top: int = 5) -> str:
    values = cells(kind, m, top=top)
    columns = COLUMNS[kind] if m.error is None else _UNREADABLE
    return "  ".join(
        _clip(value, w).ljust(w) if w else value
        for value, (_name, w) in zip(values, columns, strict=True)
    ).rstrip()


def json_line(m: Message) -> bytes:
    """One line of ``--json``: where the record is, its key, and its JSON value (or the raw
    payload, escaped, with why it is not JSON)."""
    out: dict[str, Any] = {"topic": m.topic, "partition": m.partition, "offset": m.offset,
                           "timestamp": m.timestamp,
                           "key": escaped(m.key) if m.key is not None else None}  # fmt: skip
    if m.error is None:
        out["value"] = m.value
    else:
        out.update(value=None, raw=escaped(m.raw), error=m.error)
    return orjson.dumps(out)


# --- reading ---------------------------------------------------------------------------------


@dataclass
class TailStats:
    read: int = 0
    shown: int = 0
    invalid: int = 0  # payloads that are not JSON, and undecodable batches
    partitions: int = 0
    started_ms: int = field(default_factory=clock.now_ms)


async def tail(
    settings: Settings,
    topic: str,
    *,
    start: Start,
    follow: bool,
    limit: int | None,
    filters: Filters,
    emit: Callable[[Message], None],
    stats: TailStats,
    partitions: Sequence[int] | None = None,
) -> TailStats:
    """Read ``topic`` from ``start`` (every partition, or ``partitions``), hand each matching
    message to ``emit``; without ``follow`` stop at the end offsets found when it began."""
    consumer = kafka.consumer(
        settings.kafka, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=100
    )
    await consumer.start()
    try:
        tps = await _assigned(consumer, settings, topic, partitions)
        stats.partitions = len(tps)
        ends, since_ms = await _seek(consumer, tps, start)
        reading = _Reading(
            follow=follow, limit=limit, filters=filters, emit=emit, stats=stats, ends=ends,
            since_ms=since_ms, newest_first=start.kind == "last" and not follow,
        )  # fmt: skip
        if await _read(consumer, tps, reading):
            return stats
        # "the last N": the newest across partitions, in time order
        reading.held.sort(key=lambda m: (m.timestamp, m.partition, m.offset))
        for message in reading.held[-(limit or int(start.value)) :]:
            emit(message)
            stats.shown += 1
        return stats
    finally:
        await consumer.stop()


async def _assigned(
    consumer: AIOKafkaConsumer, settings: Settings, topic: str, partitions: Sequence[int] | None
) -> list[TopicPartition]:
    """The partitions to read: every one of ``topic``, or those of ``partitions`` it has."""
    known = consumer.partitions_for_topic(topic)
    if not known:
        await consumer._client.force_metadata_update()
        known = consumer.partitions_for_topic(topic)
    if not known:
        raise StreamrankError(
            f"topic {topic!r} does not exist on {settings.kafka.bootstrap} "
            "(`streamrank topics create` makes ours)"
        )
    wanted = sorted(known) if not partitions else [p for p in partitions if p in known]
    if not wanted:
        raise StreamrankError(f"topic {topic!r} has no partition {list(partitions or [])}")
    return [TopicPartition(topic, p) for p in wanted]


async def _seek(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], start: Start
) -> tuple[dict[TopicPartition, int], int]:
    """Assign ``tps`` and seek each to where ``start`` says; returns their end offsets now
    and, for ``since``, the earliest record time to show (epoch ms; else 0)."""
    ends = await kafka.end_offsets(consumer, tps)  # assigns them to this consumer
    begins = await consumer.beginning_offsets(tps)
    by_time: dict[TopicPartition, Any] = {}
    since_ms = 0
    if start.kind == "since":
        since_ms = clock.now_ms() - int(start.value * 1000)
        by_time = await consumer.offsets_for_times({tp: since_ms for tp in tps})
    for tp in tps:
        found = by_time.get(tp)
        consumer.seek(tp, start.position(begins[tp], ends[tp], found.offset if found else None))
    return ends, since_ms


@dataclass
class _Reading:
    """One read's options and state: what to show, and the messages held back for the end."""

    follow: bool
    limit: int | None
    filters: Filters
    emit: Callable[[Message], None]
    stats: TailStats
    ends: dict[TopicPartition, int]
    since_ms: int
    newest_first: bool  # "the last N" without --follow: held, shown at the end
    held: list[Message] = field(default_factory=list)

    def take(self, tp: TopicPartition, record: Any) -> bool:
        """Count, filter and show (or hold) one record; True once ``limit`` are shown."""
        if not self.follow and record.offset >= self.ends[tp]:
            return False
        if record.timestamp is not None and record.timestamp < self.since_ms:
            # older than --since: brokers that cannot look offsets up by time
            # (the embedded one starts at the beginning) are read from further back
            return False
        self.stats.read += 1
        message = Message.from_record(record)
        if message.error is not None:
            self.stats.invalid += 1
        if not self.filters.match(message):
            return False
        if self.newest_first:
            self.held.append(message)
            return False
        self.emit(message)
        self.stats.shown += 1
        return self.limit is not None and self.stats.shown >= self.limit


async def _read(consumer: AIOKafkaConsumer, tps: list[TopicPartition], reading: _Reading) -> bool:
    """Read until every partition reached its end offset (with --follow: for ever); True when
    it stopped at ``limit``."""
    ends = reading.ends
    # the partitions still to read (with --follow: all of them, for ever)
    pending = {tp for tp in tps if reading.follow or await consumer.position(tp) < ends[tp]}
    while pending:
        batches = await consumer.getmany(*pending, timeout_ms=500)
        for tp, records in batches.items():
            for record in records:
                if reading.take(tp, record):
                    return True
        if not reading.follow:
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
        await asyncio.sleep(0)
    return False
