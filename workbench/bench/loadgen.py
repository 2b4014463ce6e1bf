"""Load generation for the scoring benchmark: Zipf traffic, open-loop and saturation drivers.

The driver produces pre-encoded RankRequests and reads the replies with its own consumer
(assigned to every partition of the reply topic, from the end), timing each request from
just before its send to its reply's arrival.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from aiokafka import TopicPartition

from streamrank import clock
from streamrank.kafka import clients as kafka
from streamrank.kafka.fetch_wait import FetchWait
from streamrank.runtime import tasks
from streamrank.settings import Settings


def zipf_ids(rng: np.random.Generator, n: int, *, n_items: int, a: float) -> np.ndarray:
    """``n`` item numbers in ``[0, n_items)``, rank-Zipf distributed (0 the most popular)."""
    ranks = np.arange(1, n_items + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-a)
    cdf /= cdf[-1]
    return np.searchsorted(cdf, rng.random(n)).astype(np.int64)


def item_name(n: int) -> str:
    return f"i{n}"


def make_requests(
    *, n: int, users: int, n_items: int, candidates: int, zipf_a: float, seed: int
) -> list[tuple[str, str, list[str]]]:
    """``(request_id, user_id, items)`` with Zipf-popular candidates and uniform users."""
    rng = np.random.default_rng(seed)
    picks = zipf_ids(rng, n * candidates, n_items=n_items, a=zipf_a).reshape(n, candidates)
    user_of = rng.integers(0, users, size=n)
    tag = uuid.uuid4().hex[:8]
    return [
        (f"{tag}-{i}", f"u{int(user_of[i])}", [f"i{int(x)}" for x in picks[i]]) for i in range(n)
    ]


def encode(
    request_id: str,
    user_id: str,
    items: Sequence[str],
    deadline_ms: int,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """A RankRequest; no ``items`` (an empty sequence) asks for retrieval; ``extra`` adds
    fields such as ``top_k`` and ``scene``."""
    body: dict[str, Any] = {"request_id": request_id, "user_id": user_id}
    if items:
        body["items"] = list(items)
    body["deadline_ms"] = deadline_ms
    return orjson.dumps({**body, **(extra or {})})


@dataclass
class RunStats:
    sent: dict[str, float] = field(default_factory=dict)  # request_id -> perf_counter at send
    got: dict[str, float] = field(default_factory=dict)  # request_id -> perf_counter at reply
    degraded: int = 0
    cached: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)

    stages: dict[str, list[float]] = field(default_factory=dict)  # worker-side timings_ms
    # request_id -> timings_ms total - queue_wait: the worker's time from its batch's start
    worker_ms: dict[str, float] = field(default_factory=dict)
    cached_ids: set[str] = field(default_factory=set)  # replies from the result cache
    timings: dict[str, dict[str, float]] = field(default_factory=dict)  # request_id -> timings_ms

    def answered(self) -> list[str]:
        """Request ids of this phase that got a reply (late replies of earlier phases excluded)."""
        return [r for r in self.got if r in self.sent]

    def latencies_ms(self) -> np.ndarray:
        return np.array([(self.got[r] - self.sent[r]) * 1000 for r in self.answered()])

    def summary(self) -> dict[str, Any]:
        lat = self.latencies_ms()
        out: dict[str, Any] = {"sent": len(self.sent), "answered": int(lat.size),
                               "degraded": self.degraded}  # fmt: skip
        if lat.size:
            out.update(p50_ms=round(float(np.percentile(lat, 50)), 2),
                       p99_ms=round(float(np.percentile(lat, 99)), 2),
                       max_ms=round(float(lat.max()), 2))  # fmt: skip
        if self.stages:
            out["worker_stage_ms_mean"] = {
                k: round(float(np.mean(v)), 2) for k, v in self.stages.items()
            }
        if self.cached:
            out["cached"] = self.cached
        return out

    def tail_trace(self, *, slowest: float = 0.01) -> dict[str, Any]:
        """Where the slowest ``slowest`` of the requests spent their round trip, beside every
        request's means: each worker stage and ``reply_path`` (round trip less the worker's
        total: the reply's produce, the broker and this reader's fetch)."""
        ids = [r for r in self.answered() if "total" in self.timings.get(r, {})]
        if not ids:
            return {}
        lat = np.array([(self.got[r] - self.sent[r]) * 1000 for r in ids])
        order = np.argsort(lat)[::-1]
        slow = [ids[i] for i in order[: max(1, round(len(ids) * slowest))]]
        return {"slowest_requests": len(slow), "slowest": self._mean_trace(slow),
                "all": self._mean_trace(ids)}  # fmt: skip

    def _mean_trace(self, ids: list[str]) -> dict[str, float]:
        rows = [{**self.timings[r], "round_trip": (self.got[r] - self.sent[r]) * 1000} for r in ids]
        for row in rows:
            row["reply_path"] = row["round_trip"] - row["total"]
        stages = sorted({stage for row in rows for stage in row})
        return {f"{s}_ms": round(float(np.mean([row[s] for row in rows if s in row])), 2)
                for s in stages}  # fmt: skip

    def stage_percentiles(self) -> dict[str, dict[str, float]]:
        """p50/p99 of each worker-side stage timing (``timings_ms``) over the replies."""
        return {
            stage: {
                "p50_ms": round(float(np.percentile(values, 50)), 3),
                "p99_ms": round(float(np.percentile(values, 99)), 3),
            }
            for stage, values in self.stages.items()
            if values
        }


class Driver:
    """One producer of requests and one reader of replies; ``async with``."""

    def __init__(
        self,
        *,
        settings: Settings,
        requests_topic: str,
        results_topic: str,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self._settings = settings
        # fields added to every request (e.g. top_k; deadline_ms None: the worker's default);
        # may be changed between phases
        self.extra = extra
        self._requests_topic = requests_topic
        self._results_topic = results_topic
        self._producer = kafka.producer(settings.kafka, acks=1, linger_ms=0)
        self._consumer = kafka.consumer(
            settings.kafka,
            enable_auto_commit=False,
            fetch_max_wait_ms=settings.scoring.fetch_wait_ms,
        )
        self._reader: asyncio.Task[None] | None = None
        self.stats = RunStats()

    async def __aenter__(self) -> Driver:
        await self._producer.start()
        await self._consumer.start()
        await self._consumer._client.force_metadata_update()
        parts = self._consumer.partitions_for_topic(self._results_topic) or set()
        tps = [TopicPartition(self._results_topic, p) for p in sorted(parts)]
        self._consumer.assign(tps)
        await self._consumer.seek_to_end(*tps)
        for tp in tps:
            await self._consumer.position(tp)
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            await tasks.cancel_and_wait([self._reader], what="load generator")
        await self._consumer.stop()
        await self._producer.stop()

    async def _read(self) -> None:
        fetch = FetchWait(self._consumer, floor_ms=self._settings.scoring.fetch_wait_ms)
        while True:
            batches = await fetch.getmany(timeout_ms=200)
            now = time.perf_counter()
            stats = self.stats  # replaced by reset() between phases
            for records in batches.values():
                for record in records:
                    reply = orjson.loads(record.value)
                    rid = reply["request_id"]
                    if rid in stats.got:
                        continue
                    stats.got[rid] = now
                    if rid in stats.sent:
                        timings = reply.get("timings_ms") or {}
                        stats.timings[rid] = timings
                        for stage, ms in timings.items():
                            stats.stages.setdefault(stage, []).append(float(ms))
                        if "total" in timings and "queue_wait" in timings:
                            stats.worker_ms[rid] = timings["total"] - timings["queue_wait"]
                    version = reply.get("model_version", "")
                    stats.versions[version] = stats.versions.get(version, 0) + 1
                    if rid in stats.sent and reply.get("cached"):
                        stats.cached += 1
                        stats.cached_ids.add(rid)
                    if reply.get("degraded"):
                        stats.degraded += 1
                        reason = str(reply.get("reason"))
                        stats.reasons[reason] = stats.reasons.get(reason, 0) + 1

    def reset(self) -> RunStats:
        old, self.stats = self.stats, RunStats()
        return old

    async def send(self, request_id: str, user_id: str, payload: bytes) -> None:
        self.stats.sent[request_id] = time.perf_counter()
        await self._producer.send(self._requests_topic, payload, key=user_id.encode())

    async def wait_answered(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.stats.answered()) >= len(self.stats.sent):
                return True
            await asyncio.sleep(0.02)
        return False

    async def open_loop(
        self, requests: Sequence[tuple[str, str, list[str]]], *, rate: float, drain_s: float = 10.0
    ) -> RunStats:
        """Send at a fixed offered rate (not slowed by replies), then wait for the answers."""
        self.reset()
        far = clock.now_ms() + 3_600_000
        start = time.perf_counter()
        for i, (rid, user, items) in enumerate(requests):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.send(rid, user, encode(rid, user, items, far, self.extra))
        await self._producer.flush()
        await self.wait_answered(drain_s)
        return self.reset()

    async def saturate(
        self, requests: Sequence[tuple[str, str, list[str]]], *, drain_s: float = 120.0
    ) -> tuple[float, RunStats]:
        """Queue every request at once; the reply rate is the worker's capacity.

        Measured over the replies after the first 10% (the worker's warm-up)."""
        self.reset()
        far = clock.now_ms() + 3_600_000
        payloads = [
            (rid, user, encode(rid, user, items, far, self.extra)) for rid, user, items in requests
        ]
        for rid, user, payload in payloads:
            await self.send(rid, user, payload)
        await self._producer.flush()
        await self.wait_answered(drain_s)
        stats = self.reset()
        times = np.sort(np.array([stats.got[r] for r in stats.answered()]))
        if times.size < 10:
            return 0.0, stats
        skip = times.size // 10
        rate = (times.size - 1 - skip) / max(1e-9, times[-1] - times[skip])
        return float(rate), stats
