"""Helpers shared by the embedding store and cache integration tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from streamrank.redis.client import is_cluster, on_each_server


class RoundTrips:
    """Round trips of the counting clients: commands sent alone, and pipelines (one each: on a
    cluster a pipeline goes to every node concurrently, one round trip of wall time)."""

    count = 0


def _counting_pipeline(pipe: Any) -> Any:
    original = pipe.execute

    async def execute(*args: Any, **kwargs: Any) -> Any:
        RoundTrips.count += 1
        return await original(*args, **kwargs)

    pipe.execute = execute
    return pipe


class CountingRedis(aioredis.Redis):
    """A real client that counts its round trips (:class:`RoundTrips`)."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        RoundTrips.count += 1
        return await super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return _counting_pipeline(super().pipeline(transaction, shard_hint))


class CountingRedisCluster(RedisCluster):
    """The same for a cluster client."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        RoundTrips.count += 1
        return await super().execute_command(*args, **options)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        return _counting_pipeline(super().pipeline(transaction, shard_hint))


def counting_client(url: str, **kwargs: Any) -> Any:
    """A counting client on ``url`` (``redis+cluster://``: a cluster client)."""
    scheme, _sep, rest = url.partition("://")
    if scheme.endswith("+cluster"):
        kwargs.setdefault("require_full_coverage", False)
        return CountingRedisCluster.from_url(
            f"{scheme.removesuffix('+cluster')}://{rest}", **kwargs
        )
    return CountingRedis.from_url(url, **kwargs)


def matrix(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


async def commandstats(client: Any) -> dict[str, int]:
    """Calls per command since the servers started (INFO commandstats, summed over masters)."""
    out: dict[str, int] = {}
    for info in await on_each_server(client, "INFO", "commandstats"):
        for k, v in info.items():
            name = k.removeprefix("cmdstat_")
            out[name] = out.get(name, 0) + int(v["calls"])
    return out


async def config_value(client: Any, name: str) -> int:
    """The smallest value of a numeric setting over every server (replicas too)."""
    replies = await on_each_server(client, "CONFIG GET", name, replicas=True)
    return min(int(r.get(name, r.get(name.encode()))) for r in replies)


async def config_set(client: Any, name: str, value: Any) -> None:
    """Set a setting on every server (replicas too)."""
    await on_each_server(client, "CONFIG SET", name, value, replicas=True)


__all__ = ["CountingRedis", "RoundTrips", "commandstats", "counting_client", "is_cluster"]
