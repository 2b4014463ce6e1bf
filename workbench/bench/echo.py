"""The benchmark's floor: an echo worker that answers rank requests without scoring them.

Same broker, topics and client settings as ``streamrank worker scoring`` (its
:mod:`~scoring.serving.kafka_clients`: ``reply_producer``, ``request_consumer`` and
``next_batch``), the same pipelining (``scoring_pipeline_depth`` batches in flight, offsets
committed in order every ``scoring_commit_interval_ms``): per batch
it decodes each request, produces a reply of zero scores, awaits the acknowledgements and
commits. No Redis, no lookup, no model. What our worker's latency adds to this floor is what
its lookups and compute cost. Run by ``streamrank bench scoring`` as a subprocess: ``python -m
workbench.bench.echo`` with the settings in the environment.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord

from schemas import Limits, RankResult, decode_request
from scoring.serving.kafka_clients import next_batch, reply_producer, request_consumer
from scoring.serving.offsets import OffsetBook
from streamrank import clock
from streamrank.errors import ContractError
from streamrank.kafka.fetch_wait import FetchWait
from streamrank.settings import Settings

logger = logging.getLogger(__name__)

ECHO_VERSION = "echo"


def echo_replies(records: Sequence[ConsumerRecord[Any, Any]], limits: Limits) -> list[RankResult]:
    """A zero-score reply per decodable request (the rest are skipped: the floor's inputs are
    all valid)."""
    now = clock.now_ms()
    out = []
    for record in records:
        try:
            request = decode_request(record.value, limits)
        except ContractError as exc:
            logger.warning("echo: skipping an invalid request: %s", exc)
            continue
        out.append(
            RankResult(
                request_id=request.request_id,
                user_id=request.user_id,
                items=request.items,
                scores=(0.0,) * len(request.items),
                model_version=ECHO_VERSION,
                timings_ms={"total": float(now - int(record.timestamp))},
                served_at=now,
            )
        )
    return out


class EchoWorker:
    """Consume, reply, commit; ``async with`` then ``await run()``."""

    def __init__(self, *, settings: Settings) -> None:
        self.settings = settings
        self._limits = Limits.from_settings(settings.limits)
        self._producer: AIOKafkaProducer = reply_producer(settings)
        self._consumer: AIOKafkaConsumer = request_consumer(
            settings, group_id=settings.scoring.group_id, client_id="streamrank-bench-echo"
        )
        self._fetch = FetchWait(self._consumer, floor_ms=settings.scoring.fetch_wait_ms)
        self._offsets = OffsetBook(commit_interval_s=settings.scoring.commit_interval_ms / 1000)

    async def __aenter__(self) -> EchoWorker:
        self._consumer.subscribe([self.settings.topics.requests])
        await self._producer.start()
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()
        await self._producer.stop()

    async def _answer(
        self, records: list[ConsumerRecord[Any, Any]], after: asyncio.Task[None] | None
    ) -> None:
        topic = self.settings.topics.results
        futures = [
            await self._producer.send(topic, r.to_json(), key=r.request_id.encode())
            for r in echo_replies(records, self._limits)
        ]
        await asyncio.gather(*futures)
        if after is not None:
            await after  # offsets are committed in order, as the scoring worker does
        self._offsets.answered(records)
        if self._offsets.due():
            await self._consumer.commit(self._offsets.take())

    async def run(self) -> None:
        inflight: collections.deque[asyncio.Task[None]] = collections.deque()
        while True:
            while inflight and inflight[0].done():
                inflight.popleft().result()
            if len(inflight) >= self.settings.scoring.pipeline_depth:
                await asyncio.wait({inflight[0]})
                continue
            records = await next_batch(self._fetch, self.settings.scoring)
            if records:
                previous = inflight[-1] if inflight else None
                inflight.append(asyncio.create_task(self._answer(records, previous)))


async def serve(settings: Settings) -> None:
    async with EchoWorker(settings=settings) as worker:
        await worker.run()


def main() -> None:
    asyncio.run(serve(Settings()))


if __name__ == "__main__":
    main()
