"""The two Kafka clients a benchmark's traffic holds: a producer for clicks (and other
events) and a :class:`scoring.client.RankClient`, opened and closed together."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Self

from schemas import ClickEvent
from streamrank.settings import Settings


class TrafficClients:
    """``async with``: ``self.producer`` (acks=all) and ``self.client`` (replies within
    ``timeout_s``) on ``settings``."""

    def __init__(self, *, settings: Settings, linger_ms: int, timeout_s: float = 120.0) -> None:
        self.settings = settings
        self._linger_ms = linger_ms
        self._timeout_s = timeout_s
        self.producer: Any = None
        self.client: Any = None

    async def __aenter__(self) -> Self:
        from scoring.client import RankClient
        from streamrank.kafka import clients as kafka

        self.producer = kafka.producer(self.settings.kafka, acks="all", linger_ms=self._linger_ms)
        await self.producer.start()
        self.client = RankClient(settings=self.settings, default_timeout_s=self._timeout_s)
        await self.client.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            await self.client.stop()
        if self.producer is not None:
            await self.producer.stop()

    async def send_clicks(self, events: Sequence[ClickEvent]) -> None:
        """Produce ``events`` keyed by user, acknowledged, 2,000 in flight at most."""
        for start in range(0, len(events), 2000):
            futures = [
                await self.producer.send(
                    self.settings.topics.clicks, e.to_json(), key=e.user_id.encode()
                )
                for e in events[start : start + 2000]
            ]
            await asyncio.gather(*futures)
