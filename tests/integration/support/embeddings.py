"""Helpers shared by the embedding store and cache integration tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import redis.asyncio as aioredis


class CountingRedis(aioredis.Redis):
    """A real client that counts round trips: commands sent alone, and pipelines (one each)."""

    round_trips = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        type(self).round_trips += 1
        return await super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        original = pipe.execute

        async def execute(raise_on_error: bool = True) -> Any:
            type(self).round_trips += 1
            return await original(raise_on_error)

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe


def matrix(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


async def commandstats(client: aioredis.Redis) -> dict[str, int]:
    """Calls per command since the server started (INFO commandstats)."""
    info = await client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}
