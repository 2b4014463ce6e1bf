"""The traffic of one arm of ``streamrank bench loop`` (:mod:`workbench.bench.loop`): the
training part's clicks as history, then the streamed part in chunks: new items announced on the
items topic before they first appear, a ranking request before each drawn click, then the
chunk's clicks, each chunk applied before the next."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas import ClickEvent, ItemEvent
from streamrank import clock
from streamrank.errors import StreamrankError
from streamrank.settings import Settings
from workbench.bench.clients import TrafficClients
from workbench.bench.loop_sim import LoopEvent, candidates, hit_at

CHUNK = 100  # clicks per chunk
WAIT_S = 120.0


@dataclass
class Answered:
    """The requests of one arm: ``(day, hit@10)`` each, and those not answered or degraded."""

    hits: list[tuple[int, bool]] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    unanswered: int = 0
    degraded: int = 0


class ArmTraffic(TrafficClients):
    """One arm's clicks, items and requests through its own topics, users prefixed by ``run``."""

    def __init__(self, *, settings: Settings, redis: Any, run: str, n_candidates: int,
                 seed: int, categories: dict[str, str]) -> None:  # fmt: skip
        # a latency-sensitive client: no linger; acks=all so a click is durable before we wait
        super().__init__(settings=settings, linger_ms=0)
        self.redis = redis
        self.run = run
        self.n_candidates = n_candidates
        self.seed = seed
        self.categories = categories
        self.answered = Answered()
        self.available: list[str] = []  # items that exist so far, in order of appearance
        self._history: dict[str, list[str]] = {}  # per raw user: items clicked so far
        self._last_ms = 0

    def user(self, raw: str) -> str:
        return f"{self.run}-{raw}"

    async def seed_history(
        self, events: Sequence[tuple[str, str, str, int]], known: Sequence[str]
    ) -> None:
        """The training part's clicks ``(user, item, category, ts_s)`` with their own times, and
        the items known then announced; returns once every user's history is applied."""
        self.available = list(known)
        await self.announce(known)
        last: dict[str, str] = {}
        batch = []
        for n, (user, item, category, ts_s) in enumerate(events):
            event_id = f"{self.run}-h{n:08d}"
            batch.append(ClickEvent(event_id=event_id, user_id=self.user(user), item_id=item,
                                    category=category or None, ts=ts_s * 1000))  # fmt: skip
            last[self.user(user)] = event_id
            self._history.setdefault(user, []).append(item)
        await self.send_clicks(batch)
        await self._wait_applied(last)

    async def announce(self, items: Sequence[str]) -> None:
        """ItemEvents for ``items`` (their categories as attributes); returns once stored."""
        from streams.attributes import read_item_attributes

        now = clock.now_ms()
        futures = []
        for item in items:
            category = self.categories.get(item) or None
            genres = tuple(category.split("|")) if category else ()
            event = ItemEvent(
                item_id=item, category=category, ts=now, attributes={"genres": genres}
            )
            futures.append(await self.producer.send(self.settings.topics.items, event.to_json(),
                                                     key=item.encode()))  # fmt: skip
        await asyncio.gather(*futures)
        end = time.monotonic() + WAIT_S
        while len(await read_item_attributes(self.redis, list(items))) < len(set(items)):
            if time.monotonic() > end:
                raise StreamrankError(f"{len(items)} item events not stored in {WAIT_S:.0f} s: is "
                                      "the features worker reading the items topic?")  # fmt: skip
            await asyncio.sleep(0.05)

    async def stream(self, events: Sequence[LoopEvent]) -> None:
        """One day's clicks, a chunk at a time."""
        for start in range(0, len(events), CHUNK):
            await self._chunk(events[start : start + CHUNK])

    async def _chunk(self, chunk: Sequence[LoopEvent]) -> None:
        fresh = [e.item for e in chunk if e.first]
        if fresh:
            self.available.extend(fresh)
            await self.announce(fresh)
        gate = asyncio.Semaphore(16)
        # features as of just after every click produced so far (their times may run ahead of
        # the wall clock by a few ms), so a request sees the same history in every run
        as_of = max(clock.now_ms(), self._last_ms + 1)
        await asyncio.gather(*(self._request(e, gate, as_of) for e in chunk if e.request))
        last: dict[str, str] = {}
        clicks = []
        for e in chunk:
            self._last_ms = max(clock.now_ms(), self._last_ms + 1)  # strictly increasing
            event_id = f"{self.run}-s{e.seq:08d}"
            clicks.append(ClickEvent(event_id=event_id, user_id=self.user(e.user), item_id=e.item,
                                     category=e.category or None, ts=self._last_ms))  # fmt: skip
            last[self.user(e.user)] = event_id
            self._history.setdefault(e.user, []).append(e.item)
        await self.send_clicks(clicks)
        await self._wait_applied(last)

    async def _request(self, event: LoopEvent, gate: asyncio.Semaphore, as_of: int) -> None:
        from scoring.client import RankRejected, RankTimeout

        items, position = candidates(event, self.available, n=self.n_candidates, seed=self.seed,
                                     exclude=self._history.get(event.user, ()))  # fmt: skip
        async with gate:
            try:
                result = await self.client.rank(self.user(event.user), items, ts=as_of,
                                                 request_id=f"{self.run}-q{event.seq}")  # fmt: skip
            except (RankTimeout, RankRejected):
                self.answered.unanswered += 1
                return
        if result.degraded:
            self.answered.degraded += 1
        by_item = dict(zip(result.items, result.scores, strict=True))
        scores = [by_item[i] for i in items]
        self.answered.hits.append((event.day, hit_at(scores, position)))
        versions = self.answered.versions
        versions[result.model_version] = versions.get(result.model_version, 0) + 1

    async def _wait_applied(self, last: dict[str, str]) -> None:
        """Until every user's newest stored event is the one produced last for it."""
        from streams.reader import FeatureReader

        reader = FeatureReader(redis=self.redis, features=self.settings.features)
        end = time.monotonic() + WAIT_S
        waiting = dict(last)
        while waiting:
            sequences = await reader.get_sequences(list(waiting))
            waiting = {u: e for u, e in waiting.items()
                       if not sequences.get(u) or sequences[u][-1].event_id != e}  # fmt: skip
            if not waiting:
                return
            if time.monotonic() > end:
                raise StreamrankError(f"{len(waiting)} users' clicks not applied in {WAIT_S:.0f} "
                                      "s: is the features worker running?")  # fmt: skip
            await asyncio.sleep(0.05)
