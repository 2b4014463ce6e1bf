"""The version watcher polls the real Redis through our client (socket timeout set): its stop
returns whatever loop iteration of a poll the cancellation lands in (one cancellation is lost
by redis-py's ``wait_for`` on Python 3.11; a scoring worker that could not reach Kafka hung in
this stop instead of exiting)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from scoring.serving.metrics import ScoringMetrics
from scoring.serving.watcher import VersionWatcher
from streamrank.redis.client import redis_client
from streamrank.settings import Settings


class NoEmbeddings:
    async def lookup(self, version: str, table: str, ids: object) -> object:
        raise AssertionError("nothing is served")

    async def warm(self, version: str, table: str, ids: object) -> int:
        return 0

    def stats(self) -> dict[str, object]:
        return {}


async def placeholder(version: str) -> object:
    return version  # whatever another test left active in the shared Redis: never scored


async def test_the_watcher_stops_whichever_iteration_of_a_poll_the_cancel_lands_in(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    redis = redis_client(settings.redis)
    try:
        for turns in range(40):
            watcher = VersionWatcher(
                redis=redis, loader=placeholder, embeddings=NoEmbeddings(),
                metrics=ScoringMetrics(CollectorRegistry()), poll_s=0,
            )  # fmt: skip
            watcher.start()
            for _ in range(turns):
                await asyncio.sleep(0)
            async with asyncio.timeout(10):
                await watcher.stop()
    finally:
        await redis.aclose()
