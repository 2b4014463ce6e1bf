"""The broker's true floor: a minimal aiokafka echo (getmany, decode, send, nothing else).

Unlike :mod:`workbench.bench.echo`, which reuses the scoring worker's intake loop (batch
gathering, pipelining, ordered commits, acks=all), this is what the thinnest client could do
on the same broker: aiokafka's defaults (offsets auto-committed, acks=1, linger 0) but the
worker's fetch wait (``STREAMRANK_SCORING_FETCH_WAIT_MS``, raised as the worker's is when the
broker starves it: :class:`~streamrank.kafka.fetch_wait.FetchWait`), each fetched request
decoded and answered with zero scores, sends not awaited one by one. What the
echo adds to this floor is our intake loop's; what our worker adds to the echo is lookups and
compute. Run by ``streamrank bench scoring`` as ``python -m workbench.bench.floor``.
"""

from __future__ import annotations

import asyncio
import logging

from schemas import Limits
from streamrank.kafka import clients as kafka
from streamrank.kafka.fetch_wait import FetchWait
from streamrank.settings import Settings
from workbench.bench.echo import echo_replies

logger = logging.getLogger(__name__)


async def serve(settings: Settings) -> None:
    """Consume requests and answer each with zero scores until cancelled."""
    limits = Limits.from_settings(settings.limits)
    producer = kafka.producer(settings.kafka, acks=1, linger_ms=0)
    consumer = kafka.consumer(
        settings.kafka,
        group_id=settings.scoring.group_id,
        client_id="streamrank-bench-floor",
        **kafka.group_kwargs(settings.kafka),
        enable_auto_commit=True,
        auto_offset_reset="earliest",
        # the worker's fetch wait: a broker may hold a fetch for all of aiokafka's 500 ms default
        fetch_max_wait_ms=settings.scoring.fetch_wait_ms,
    )
    consumer.subscribe([settings.topics.requests])
    await producer.start()
    await consumer.start()
    fetch = FetchWait(consumer, floor_ms=settings.scoring.fetch_wait_ms)
    try:
        while True:
            got = await fetch.getmany(timeout_ms=200)
            records = [r for part in got.values() for r in part]
            for reply in echo_replies(records, limits):
                await producer.send(
                    settings.topics.results, reply.to_json(), key=reply.request_id.encode()
                )
    finally:
        await consumer.stop()
        await producer.stop()


def main() -> None:
    asyncio.run(serve(Settings()))


if __name__ == "__main__":
    main()
