"""Keep one undecodable record batch from crashing a worker or stopping its partition.

aiokafka decodes fetched record batches lazily, inside ``getmany``. A batch it cannot decode
(an unknown codec, a corrupt compressed payload, a CRC mismatch, a record it cannot parse)
raises out of ``getmany``: the records already drained from other partitions in that call are
dropped although their positions moved on, and the same batch is fetched and fails again,
forever. aiokafka offers no hook for this, so this module replaces one private method,
``PartitionRecords._unpack_records`` (the generator that turns a fetched buffer into
``ConsumerRecord``s), with a copy of it that contains a fault to its batch:

- the first ``REFETCHES`` times a batch fails, the partition's iteration ends just before it, so
  the consumer fetches it again (a buffer corrupted in transit decodes the second time);
- after that the batch is skipped: one marker record stands for it, with offset = the batch's
  last offset and an :class:`UndecodableBatch` value (the batch's raw bytes as far as they were
  read, the offsets it covered and why). Workers dead-letter the marker, count it, and commit
  past it, so the partition moves on and nothing else in the fetch is lost.

Valid input yields exactly what aiokafka yields (a unit test compares the two on plain,
compressed, transactional and control batches). This is the only module that touches aiokafka's
fetcher internals; ``pyproject.toml`` pins aiokafka below the next minor release for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import aiokafka.errors as kafka_errors
from aiokafka.consumer import fetcher as _fetcher
from aiokafka.structs import ConsumerRecord

from streamrank.errors import one_line

logger = logging.getLogger(__name__)

REFETCHES = 2  # extra fetches of a failing batch before it is skipped
_MAX_TRACKED = 1024  # failing batches remembered between fetches (bounded)


class UndecodableBatch(bytes):
    """Value of the marker record of a skipped batch: its raw bytes (as far as they could be
    read), the offsets it covered and why it could not be decoded."""

    first_offset: int
    last_offset: int
    error: str

    def __new__(cls, raw: bytes, *, first_offset: int, last_offset: int, error: str) -> Any:
        value = super().__new__(cls, raw)
        value.first_offset = first_offset
        value.last_offset = last_offset
        value.error = error
        return value

    def describe(self, topic: str, partition: int) -> str:
        """One line for logs and dead letters."""
        span = (
            f"offset {self.first_offset}"
            if self.first_offset == self.last_offset
            else f"offsets {self.first_offset}-{self.last_offset}"
        )
        return f"{topic}[{partition}] {span} skipped: the record batch cannot be decoded ({self.error})"


def is_undecodable(record: Any) -> bool:
    """Whether a consumed record is the marker of a skipped batch."""
    return isinstance(getattr(record, "value", None), UndecodableBatch)


_failures: dict[tuple[str, int, int], int] = {}
_lock = threading.Lock()  # Faust fetches in its own thread


def _failed_before(key: tuple[str, int, int]) -> int:
    """How many times this batch failed before now (and count this failure)."""
    with _lock:
        seen = _failures.get(key, 0)
        if seen >= REFETCHES:
            _failures.pop(key, None)
        else:
            if len(_failures) >= _MAX_TRACKED:
                _failures.clear()
            _failures[key] = seen + 1
        return seen


def _forget(key: tuple[str, int, int]) -> None:
    with _lock:
        _failures.pop(key, None)


def _marker(
    self: Any, raw: bytes, first: int, last: int, exc: BaseException
) -> ConsumerRecord[Any, Any]:
    tp = self._tp
    value = UndecodableBatch(raw, first_offset=first, last_offset=last, error=one_line(exc))
    logger.error("%s", value.describe(tp.topic, tp.partition))
    return ConsumerRecord(tp.topic, tp.partition, last, -1, 0, None, value, None, -1, len(raw), ())


def _guarded_unpack_records(self: Any) -> Iterator[ConsumerRecord[Any, Any]]:
    """aiokafka's ``PartitionRecords._unpack_records`` with each batch's fault contained."""
    tp = self._tp
    records = self._records
    while records.has_next():
        start = self.next_fetch_offset
        batch = None
        try:
            batch = records.next_batch()
            if self._check_crcs and not batch.validate_crc():
                raise kafka_errors.CorruptRecordException(f"Invalid CRC - {tp}")
            if self._isolation_level == _fetcher.READ_COMMITTED and batch.producer_id is not None:
                self._consume_aborted_up_to(batch.base_offset)
                if batch.is_control_batch and self._contains_abort_marker(batch):
                    self._aborted_producers.discard(batch.producer_id)
                if batch.is_transactional and batch.producer_id in self._aborted_producers:
                    self.next_fetch_offset = batch.next_offset
                    continue
            if batch.is_control_batch:
                self.next_fetch_offset = batch.next_offset
                continue
            for record in batch:
                if record.offset < self.next_fetch_offset:
                    continue  # a compressed batch fetched from its middle
                consumer_record = self._consumer_record(tp, record)
                self.next_fetch_offset = record.offset + 1
                yield consumer_record
            self.next_fetch_offset = batch.next_offset
            if _failures:  # it failed on an earlier fetch and decoded now: forget it
                _forget((tp.topic, tp.partition, batch.base_offset))
        except Exception as exc:
            base = batch.base_offset if batch is not None else start
            if _failed_before((tp.topic, tp.partition, base)) < REFETCHES:
                logger.warning(
                    "%s[%s]: the record batch at offset %s cannot be decoded (%s); fetching it "
                    "again",
                    tp.topic,
                    tp.partition,
                    base,
                    one_line(exc),
                )
                return  # the position stays before the batch: the next fetch reads it again
            first = self.next_fetch_offset
            if batch is None:
                # The buffer itself is unreadable: skip one offset, then fetch afresh.
                self.next_fetch_offset = first + 1
                yield _marker(self, b"", first, first, exc)
                return
            last = batch.next_offset - 1
            self.next_fetch_offset = batch.next_offset
            if last >= first:
                yield _marker(self, _raw_bytes(batch), first, last, exc)


def _raw_bytes(batch: Any) -> bytes:
    buffer = getattr(batch, "_buffer", None)
    try:
        return bytes(buffer) if buffer is not None else b""
    except Exception:  # a C batch without a readable buffer: the offsets still say what it was
        return b""


_original = _fetcher.PartitionRecords._unpack_records


def install() -> None:
    """Replace aiokafka's batch unpacking with the guarded one (idempotent, process-wide)."""
    _fetcher.PartitionRecords._unpack_records = _guarded_unpack_records


def uninstall() -> None:
    """Restore aiokafka's own unpacking (tests)."""
    _fetcher.PartitionRecords._unpack_records = _original
