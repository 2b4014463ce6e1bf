"""Producers of the real-producer tests: librdkafka (confluent-kafka) with any codec, headers and
transactions, and a raw record batch written straight into a partition (a batch no client would
build: garbled compressed bytes under a valid CRC)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.record._crc32c import crc as crc32c
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from confluent_kafka import Consumer, Producer

Message = tuple[bytes | None, bytes, Sequence[tuple[str, bytes]]]  # key, value, headers


def librdkafka_produce(
    bootstrap: str,
    topic: str,
    messages: Iterable[Message],
    *,
    codec: str,
    partition: int | None = None,
    **config: Any,
) -> int:
    """Produce with librdkafka (``compression.type`` = ``codec``), to ``partition`` or by key;
    returns how many were acknowledged."""
    acked = 0

    def delivered(err: Any, _msg: Any) -> None:
        nonlocal acked
        if err is None:
            acked += 1

    producer = Producer(
        {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20, **config}
    )
    where = {} if partition is None else {"partition": partition}
    for key, value, headers in messages:
        producer.produce(
            topic, value, key=key, headers=list(headers), on_delivery=delivered, **where
        )
    left = producer.flush(30)
    assert left == 0, f"{left} messages not delivered"
    return acked


def librdkafka_read(bootstrap: str, topic: str, *, want: int, timeout_s: float = 30) -> list[Any]:
    """Read ``topic`` from the beginning with librdkafka (no group: partitions assigned)."""
    import time

    from confluent_kafka import OFFSET_BEGINNING
    from confluent_kafka import TopicPartition as CTopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([CTopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < want and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                out.append(message)
        return out
    finally:
        consumer.close()


def garbled_gzip_batch(values: Sequence[bytes], *, key: bytes) -> bytes:
    """A v2 record batch flagged gzip whose records section is not gzip, with a CRC that matches
    (so neither the broker nor the CRC check refuses it: only decoding fails)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=1, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for delta, value in enumerate(values):
        builder.append(delta, timestamp=None, key=key, value=value, headers=[])
    raw = bytearray(builder.build())
    body = b"\x00not-gzip" * 8
    raw[61:] = body
    struct.pack_into(">i", raw, 8, len(raw) - 12)  # batch length after the offset + length fields
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    return bytes(raw)


async def produce_raw_batch(bootstrap: str, topic: str, partition: int, batch: bytes) -> None:
    """Append ``batch`` as it is to one partition (a ProduceRequest, acks=all)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        await client._metadata_update(client.cluster, [topic])
        leader = client.cluster.leader_for_partition(TopicPartition(topic, partition))
        request = ProduceRequest(
            transactional_id=None, required_acks=-1, timeout=10_000,
            topics=[(topic, [(partition, batch)])],
        )  # fmt: skip
        response = await client.send(leader, request)
        [(_topic, [(_p, error, *_rest)])] = response.topics
        assert error == 0, f"the broker refused the raw batch: error {error}"
    finally:
        await client.close()


async def in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)
