"""The undecodable-batch guard: same records as aiokafka on valid input; a broken batch is
fetched again twice, then skipped as one marker record, and the batches after it still come."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.consumer import fetcher
from aiokafka.record._crc32c import crc as crc32c
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from streamrank.kafka import guard as kafka_guard
from streamrank.kafka.guard import REFETCHES, UndecodableBatch, is_undecodable

TP = TopicPartition("clicks", 3)
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
ATTRIBUTES_AT, CRC_AT = 21, 17  # byte offsets in a v2 record batch header


def batch(
    base: int,
    values: list[bytes],
    *,
    codec: str = "none",
    producer_id: int = -1,
    transactional: bool = False,
    headers: list[tuple[str, bytes]] | None = None,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=CODECS[codec],
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        batch_size=1 << 20,
    )
    for delta, value in enumerate(values):
        builder.append(
            delta, timestamp=1_700_000_000_000, key=b"u1", value=value, headers=headers or []
        )
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base)
    return bytes(raw)


def rewrite(raw: bytes, *, attributes: int | None = None, body: bytes | None = None) -> bytes:
    """A batch with changed attributes or records section, and a CRC that matches again."""
    out = bytearray(raw)
    if attributes is not None:
        struct.pack_into(">h", out, ATTRIBUTES_AT, attributes)
    if body is not None:
        out[61:] = body
        struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">I", out, CRC_AT, crc32c(bytes(out[ATTRIBUTES_AT:])))
    return bytes(out)


def commit_marker(base: int, producer_id: int) -> bytes:
    control_key = struct.pack(">hh", 0, 1)  # version 0, type 1 = COMMIT
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=True, producer_id=producer_id,
        producer_epoch=0, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    builder.append(
        0,
        timestamp=1_700_000_000_000,
        key=control_key,
        value=b"\x00\x00\x00\x00\x00\x00",
        headers=[],
    )
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base)
    attrs = struct.unpack_from(">h", raw, ATTRIBUTES_AT)[0] | 0x20  # the control bit
    return rewrite(bytes(raw), attributes=attrs)


def unpack(buffer: bytes, *, fetch_offset: int = 0, committed: bool = False) -> list[Any]:
    level = fetcher.READ_COMMITTED if committed else fetcher.READ_UNCOMMITTED
    records = fetcher.PartitionRecords(
        TP, MemoryRecords(buffer), [], fetch_offset, None, None, True, level
    )
    out = list(records)
    out.append(("next_fetch_offset", records.next_fetch_offset))
    return out


def plain(records: list[Any]) -> list[Any]:
    return [
        r if isinstance(r, tuple) else (r.offset, r.key, r.value, tuple(r.headers)) for r in records
    ]


@pytest.fixture
def guard() -> Iterator[None]:
    kafka_guard.install()
    kafka_guard._failures.clear()
    yield
    kafka_guard.uninstall()


VALID = (
    batch(0, [b"a", b"b"])
    + batch(2, [b"c" * 300, b"d"], codec="gzip", headers=[("trace", b"t-1")])
    + batch(4, [b"e"], codec="snappy")
    + batch(5, [b"f", b"g"], codec="lz4")
    + batch(7, [b"h"], codec="zstd")
    + batch(8, [b"tx1", b"tx2"], producer_id=42, transactional=True)
    + commit_marker(10, 42)
    + batch(11, [b"i"])
)


@pytest.mark.parametrize("committed", [False, True])
@pytest.mark.parametrize("fetch_offset", [0, 3])
def test_valid_input_yields_exactly_what_aiokafka_yields(
    committed: bool, fetch_offset: int
) -> None:
    kafka_guard.uninstall()
    upstream = plain(unpack(VALID, fetch_offset=fetch_offset, committed=committed))
    kafka_guard.install()
    try:
        guarded = plain(unpack(VALID, fetch_offset=fetch_offset, committed=committed))
    finally:
        kafka_guard.uninstall()
    assert guarded == upstream
    values = [r[2] for r in guarded if not isinstance(r[0], str)]
    assert values[-1] == b"i" and (b"tx1" in values) and upstream[-1] == ("next_fetch_offset", 12)


def broken_cases() -> dict[str, bytes]:
    good = batch(2, [b"x", b"y", b"z"], codec="gzip")
    return {
        "garbled gzip payload": rewrite(good, body=b"\x00not-gzip" * 4),
        "unknown codec id": rewrite(good, attributes=5),
        "crc mismatch": good[:-1] + bytes([good[-1] ^ 0xFF]),
    }


@pytest.mark.parametrize("case", sorted(broken_cases()))
def test_a_broken_batch_is_refetched_then_skipped_as_one_marker(guard: None, case: str) -> None:
    buffer = batch(0, [b"a", b"b"]) + broken_cases()[case] + batch(5, [b"after"])
    for _attempt in range(REFETCHES):
        # The records before it come; the position stops at the broken batch: fetch again.
        assert plain(unpack(buffer)) == [
            (0, b"u1", b"a", ()),
            (1, b"u1", b"b", ()),
            ("next_fetch_offset", 2),
        ]
    got = unpack(buffer)
    assert [r.value for r in got[:2]] == [b"a", b"b"]
    marker = got[2]
    assert is_undecodable(marker) and isinstance(marker.value, UndecodableBatch)
    assert (marker.topic, marker.partition, marker.offset) == ("clicks", 3, 4)
    assert (marker.value.first_offset, marker.value.last_offset) == (2, 4)
    assert marker.value.error
    assert "clicks[3] offsets 2-4 skipped" in marker.value.describe("clicks", 3)
    assert got[3].value == b"after" and got[4] == ("next_fetch_offset", 6)


def test_a_batch_that_decodes_on_the_second_fetch_is_not_skipped(guard: None) -> None:
    good = batch(0, [b"a"], codec="gzip")
    broken = rewrite(good, body=b"\x00garbage!")
    assert plain(unpack(broken)) == [("next_fetch_offset", 0)]  # first fetch corrupt in transit
    assert plain(unpack(good)) == [(0, b"u1", b"a", ()), ("next_fetch_offset", 1)]
    assert kafka_guard._failures == {}  # forgotten once it decoded
