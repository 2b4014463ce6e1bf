"""Reading a version's online statistics for a time window from Redis (one pipeline)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from scoring.rollout.stats import Summary, VersionStats, summarize
from streamrank import keys
from streamrank.redis.errors import redis_call

WINDOWS: dict[str, int] = {"10m": 600, "1h": 3600}  # the rolling windows exported and shown


@dataclass(frozen=True, slots=True)
class Window:
    """Requests served in ``[start_ms, end_ms]``, at the statistics' bucket resolution (the
    first and last buckets count whole)."""

    start_ms: int
    end_ms: int
    bucket_s: int

    def bucket_starts(self) -> list[int]:
        first = self.start_ms // 1000 // self.bucket_s * self.bucket_s
        last = self.end_ms // 1000 // self.bucket_s * self.bucket_s
        return list(range(first, last + 1, self.bucket_s))

    @classmethod
    def trailing(cls, seconds: int, *, now_ms: int, bucket_s: int) -> Window:
        return cls(now_ms - seconds * 1000, now_ms, bucket_s)


async def read_stats(
    redis: aioredis.Redis, versions: Sequence[str], window: Window
) -> dict[str, VersionStats]:
    """Each version's summed statistics over ``window`` (one round trip for all of them)."""
    starts = window.bucket_starts()
    with redis_call("reading online statistics", "check that Redis is up"):
        pipe = redis.pipeline(transaction=False)
        for version in versions:
            for start in starts:
                pipe.hgetall(keys.outcome_stats(window.bucket_s, version, start))
        raw = await pipe.execute()
    out: dict[str, VersionStats] = {}
    for n, version in enumerate(versions):
        parts = raw[n * len(starts) : (n + 1) * len(starts)]
        out[version] = VersionStats.total(VersionStats.from_hash(h) for h in parts if h)
    return out


async def read_summaries(
    redis: aioredis.Redis, versions: Sequence[str], window: Window
) -> dict[str, Summary]:
    """Each version's metrics with intervals over ``window``."""
    stats = await read_stats(redis, versions, window)
    return {v: summarize(s) for v, s in stats.items()}


async def recent_versions(redis: aioredis.Redis, *, since_ms: int) -> list[str]:
    """Versions that served a request since ``since_ms`` (newest first)."""
    with redis_call("listing versions with online statistics", "check that Redis is up"):
        raw = await redis.zrevrangebyscore(keys.outcome_versions(), "+inf", since_ms)
    return [v.decode() if isinstance(v, bytes) else str(v) for v in raw]
