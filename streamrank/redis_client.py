"""Every Redis client of ours is made here, from the settings: the URL, timeouts and TLS. One
place, so that how streamrank connects (standalone today; a cluster or Sentinel client is the
same call) is decided once."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from streamrank.settings import Settings


def redis_client(settings: Settings, *, timeout_s: float | None = None, **options: Any) -> Any:
    """An asyncio Redis client on ``settings.redis_dsn`` (bytes replies). ``timeout_s``
    overrides the socket timeout of its calls (long batch writes, benchmarks); ``options`` are
    redis-py's."""
    kwargs = settings.redis_client_kwargs()
    if timeout_s is not None:
        kwargs["socket_timeout"] = timeout_s
    kwargs.update(options)
    return aioredis.from_url(settings.redis_dsn, **kwargs)
