"""The benchmark's baseline: a naive scoring worker, one request at a time.

Per request: one sequence read, one Redis HGET per item id (candidates and history, fp32 rows,
no cache), the straightforward training ``DIN.forward`` (history repeated for every
candidate), one reply awaited, one commit. Run by ``streamrank bench scoring`` as a
subprocess: ``python -m workbench.bench.naive`` with the settings in the environment and the
fp32 table's version in ``STREAMRANK_BENCH_NAIVE_VERSION``.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import torch
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas import RankResult, decode_request
from scoring.embeddings.bucketing import bucket_of
from scoring.embeddings.codec import decode_blobs
from scoring.embeddings.store import EmbeddingStore
from scoring.model.registry import load_scorer_from_redis
from scoring.serving.wiring import configure_torch
from streamrank import clock, keys
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from streams.reader import FeatureReader


async def serve(settings: Settings, *, table_version: str, model_version: str) -> None:
    configure_torch(settings.scoring)
    redis = redis_client(settings.redis)
    store = EmbeddingStore(redis=redis)
    meta = await store.table_meta(table_version, keys.ITEM_TABLE)
    scorer, _config = await load_scorer_from_redis(redis, model_version)
    net = scorer.net
    reader = FeatureReader(redis=redis, features=settings.features)
    oov = np.asarray(meta.oov_row, dtype=np.float32)

    async def row(item_id: str) -> np.ndarray:
        bucket = int(bucket_of([item_id], meta.buckets)[0])
        raw = await redis.hget(meta.bucket_key(bucket), item_id)
        if raw is None:
            return oov
        blob = raw if isinstance(raw, bytes) else raw.encode("latin-1")
        return decode_blobs([blob], "fp32", meta.dim)[0]

    producer = AIOKafkaProducer(**settings.kafka.client_kwargs(), acks="all")
    consumer = AIOKafkaConsumer(
        settings.topics.requests,
        **settings.kafka.client_kwargs(),
        group_id=settings.scoring.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await producer.start()
    await consumer.start()
    try:
        while True:
            record = await consumer.getone()
            request = decode_request(record.value)
            sequences = await reader.get_sequences([request.user_id])
            events = sequences.get(request.user_id, [])[-settings.features.sequence_length :]
            hist_rows = [await row(e.item_id) for e in events]
            cand_rows = [await row(i) for i in request.items]
            c, length = len(cand_rows), max(1, len(hist_rows))
            hist = torch.zeros(c, length, meta.dim)  # [C, L, d]
            mask = torch.zeros(c, length, dtype=torch.bool)  # [C, L]
            if hist_rows:
                hist[:, : len(hist_rows)] = torch.from_numpy(np.stack(hist_rows))
                mask[:, : len(hist_rows)] = True
            cands = torch.from_numpy(np.stack(cand_rows))  # [C, d]
            with torch.inference_mode():
                scores = torch.sigmoid(net(hist, mask, cands)).tolist()  # [C]
            result = RankResult(
                request_id=request.request_id,
                user_id=request.user_id,
                items=request.items,
                scores=tuple(scores),
                model_version=model_version,
                served_at=clock.now_ms(),
            )
            await producer.send_and_wait(
                settings.topics.results, result.to_json(), key=request.request_id.encode()
            )
            tp = TopicPartition(record.topic, record.partition)
            await consumer.commit({tp: record.offset + 1})
    finally:
        await consumer.stop()
        await producer.stop()
        await redis.aclose()


def main() -> None:
    settings = Settings()
    asyncio.run(
        serve(
            settings,
            table_version=os.environ["STREAMRANK_BENCH_NAIVE_VERSION"],
            model_version=os.environ["STREAMRANK_BENCH_MODEL_VERSION"],
        )
    )


if __name__ == "__main__":
    main()
