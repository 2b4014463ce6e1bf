"""The traffic of ``streamrank bench rollout`` (:mod:`workbench.bench.rollout`): rounds of an
artifact's test users through the stack, each user's history as clicks, one ranking request per
user, then the user's held-out positive as a click."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from streamrank.settings import Settings
from workbench.bench.clients import TrafficClients


class Traffic(TrafficClients):
    """Rounds of test users through the stack: histories as clicks, one request each, then the
    held-out positive as a click after the reply."""

    def __init__(
        self, *, settings: Settings, redis: Any, cases: Sequence[Any], chunk: int,
        concurrency: int, progress: bool,
    ) -> None:  # fmt: skip
        super().__init__(settings=settings, linger_ms=5)
        self.redis = redis
        self.cases = list(cases)
        self.chunk = chunk
        self.concurrency = concurrency
        self.progress = progress
        self.requests = 0
        self.degraded = 0
        self.unanswered = 0

    async def round(self, prefix: str, *, until: asyncio.Task[Any] | None = None) -> None:
        """All test users once under ``prefix``, in chunks; stops early once ``until`` ends."""
        for start in range(0, len(self.cases), self.chunk):
            if until is not None and until.done():
                return
            await self._chunk(prefix, start, self.cases[start : start + self.chunk])

    async def _chunk(self, prefix: str, start: int, chunk: Sequence[Any]) -> None:
        from schemas import ClickEvent
        from scoring.client import RankRejected, RankTimeout
        from streamrank import clock
        from workbench.devstack.cases import click_events, expected_sequences, wait_applied

        await self.send_clicks(click_events(chunk, run=prefix))
        await wait_applied(
            self.redis, self.settings,
            expected_sequences(chunk, run=prefix, length=self.settings.features.sequence_length),
            timeout_s=300, progress=False, log_path=None,
        )  # fmt: skip
        gate = asyncio.Semaphore(self.concurrency)

        async def one(n: int, case: Any) -> None:
            async with gate:
                user = f"{prefix}-{case.user_id}"
                try:
                    result = await self.client.rank(
                        user, case.items, request_id=f"{prefix}-q{start + n}"
                    )
                except (RankTimeout, RankRejected):
                    self.unanswered += 1
                    return
                self.requests += 1
                self.degraded += int(result.degraded)
                click = ClickEvent(
                    event_id=f"{prefix}-pos{start + n}",
                    user_id=user,
                    item_id=case.items[case.labels.index(1)],  # the held-out positive
                    ts=clock.now_ms(),
                )
                await self.producer.send(
                    self.settings.topics.clicks, click.to_json(), key=user.encode()
                )

        await asyncio.gather(*(one(n, c) for n, c in enumerate(chunk)))
        await self.producer.flush()
