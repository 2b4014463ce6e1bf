"""``streamrank bench codecs``: what each ``kafka_compression`` costs our producers and buys.

The messages are the scoring worker's replies (RankResults of ``--items`` candidates, the bulk
of what streamrank produces), sent as the worker sends them: micro-batches of ``--batch`` with
acks=all and linger 1 ms, then read back by a consumer of ours. For every codec, in the same run
and against ``none`` as the baseline: record-batch bytes per message (what the network and the
broker's disk carry), producer CPU per message, produce+ack throughput and consumer CPU per
message. Codecs take turns within each of ``--repeats`` rounds; figures are medians.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from schemas import RankResult
from streamrank.kafka import clients as kafka
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
_CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=4000, help="replies per codec per round")
    parser.add_argument("--items", type=int, default=100, help="candidates per reply")
    parser.add_argument("--batch", type=int, default=32, help="replies per produce burst")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (figures are medians)")


def replies(n: int, items: int, seed: int = 0) -> list[bytes]:
    """``n`` realistic replies: MovieLens-sized item ids, float32-like scores, stage timings."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids = tuple(str(rng.randrange(1, 1683)) for _ in range(items))
        result = RankResult(
            request_id=uuid.UUID(int=rng.getrandbits(128)).hex,
            user_id=str(rng.randrange(1, 944)),
            items=ids,
            scores=tuple(rng.random() for _ in ids),
            model_version="din-20261201-a1b2c3",
            timings_ms={"queue_wait": 1.2, "sequence_fetch": 0.4, "forward": 1.9, "total": 3.6},
            served_at=1_800_000_000_000 + i,
        )
        out.append(result.to_json())
    return out


def batch_bytes(messages: list[bytes], codec: str, batch: int) -> int:
    """Bytes of the record batches a producer builds for ``messages`` in bursts of ``batch``."""
    total = 0
    for start in range(0, len(messages), batch):
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=_CODEC_IDS[codec], is_transactional=False,
            producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 24,
        )  # fmt: skip
        for offset, value in enumerate(messages[start : start + batch]):
            builder.append(offset, timestamp=None, key=b"0123456789abcdef", value=value, headers=[])
        total += len(builder.build())
    return total


async def _produce(
    settings: Settings, topic: str, messages: list[bytes], batch: int
) -> dict[str, float]:
    producer = kafka.producer(settings.kafka, acks="all", linger_ms=1)
    await producer.start()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        for start in range(0, len(messages), batch):
            futures = [
                await producer.send(topic, value, key=b"0123456789abcdef")
                for value in messages[start : start + batch]
            ]
            await asyncio.gather(*futures)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await producer.stop()
    return {"msgs_per_s": len(messages) / wall, "cpu_us": cpu * 1e6 / len(messages)}


async def _consume(settings: Settings, topic: str, want: int) -> float:
    consumer = kafka.consumer(
        settings.kafka, topic, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        got, cpu = 0, time.process_time()
        while got < want:
            batches = await consumer.getmany(timeout_ms=1000)
            if not batches:
                raise RuntimeError(f"{topic}: read {got} of {want} messages back")
            got += sum(len(records) for records in batches.values())
        return (time.process_time() - cpu) * 1e6 / want
    finally:
        await consumer.stop()


async def _bench(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    messages = replies(args.messages, args.items)
    run_id = uuid.uuid4().hex[:8]
    rows: dict[str, dict[str, list[float]]] = {c: {} for c in CODECS}
    for round_ in range(args.repeats):
        for codec in CODECS:
            topic = f"bench-codecs-{run_id}-{codec}-{round_}"
            await create_topics(settings, partitions=1, topics=(topic,))
            codec_settings = settings.with_env(STREAMRANK_KAFKA_COMPRESSION=codec)
            produced = await _produce(codec_settings, topic, messages, args.batch)
            consumer_cpu = await _consume(codec_settings, topic, len(messages))
            row = rows[codec]
            for key, value in (*produced.items(), ("consumer_cpu_us", consumer_cpu)):
                row.setdefault(key, []).append(value)
    sizes = {c: batch_bytes(messages, c, args.batch) / len(messages) for c in CODECS}
    base = {key: statistics.median(values) for key, values in rows["none"].items()}
    out: dict[str, Any] = {
        "message": f"RankResult with {args.items} items",
        "messages_per_round": args.messages,
        "rounds": args.repeats,
        "payload_bytes_per_msg": round(sum(map(len, messages)) / len(messages), 1),
        "codecs": {},
    }
    for codec in CODECS:
        med = {key: statistics.median(values) for key, values in rows[codec].items()}
        out["codecs"][codec] = {
            "bytes_per_msg": round(sizes[codec], 1),
            "bytes_vs_none": round(sizes[codec] / sizes["none"], 3),
            "producer_cpu_us_per_msg": round(med["cpu_us"], 1),
            "producer_cpu_vs_none": round(med["cpu_us"] / base["cpu_us"], 3),
            "produce_msgs_per_s": round(med["msgs_per_s"], 1),
            "produce_rate_vs_none": round(med["msgs_per_s"] / base["msgs_per_s"], 3),
            "consumer_cpu_us_per_msg": round(med["consumer_cpu_us"], 1),
            "consumer_cpu_vs_none": round(med["consumer_cpu_us"] / base["consumer_cpu_us"], 3),
        }
    return out


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from workbench.devstack.pipeline import stack_or_private

    with (
        tempfile.TemporaryDirectory(
            prefix="streamrank-bench-codecs-", ignore_cleanup_errors=True
        ) as tmp,
        stack_or_private(settings, run_dir=Path(tmp)) as (settings, stack),
    ):
        result = asyncio.run(_bench(settings, args))
    result["private_stack"] = stack is not None
    return result
