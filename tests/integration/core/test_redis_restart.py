"""Our Redis clients after the server restarts: every pooled connection is dead then, and none of
them may fail a command (redis-py's clients from a URL retry nothing by themselves)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from streamrank.redis.client import client_for_url, redis_client
from streamrank.settings import Settings
from workbench.devstack.servers import RedisServer
from workbench.devstack.services import free_port

CONCURRENT = 16  # connections the pool holds before the restart


async def commands_after_restart(client: Any, server: RedisServer) -> list[BaseException]:
    await asyncio.gather(*(client.set(f"k{i}", i) for i in range(CONCURRENT)))
    server.kill()
    with pytest.raises(RedisConnectionError):  # down: the error still surfaces
        await client.ping()
    server.start()
    failures: list[BaseException] = []
    for _ in range(5):  # every pooled connection is used at least once
        results = await asyncio.gather(
            *(client.get(f"k{i}") for i in range(CONCURRENT)),
            client.pipeline(transaction=False).incr("n").incr("n").execute(),
            return_exceptions=True,
        )
        failures += [r for r in results if isinstance(r, BaseException)]
    return failures


@pytest.mark.parametrize("make", ["settings", "url"])
async def test_no_command_fails_on_a_connection_the_restart_killed(
    tmp_path: Path, make: str
) -> None:
    server = RedisServer(port=free_port(), run_dir=tmp_path, persist="aof")
    server.start()
    settings = Settings().with_env(STREAMRANK_REDIS_URL=server.url, STREAMRANK_REDIS_TIMEOUT_S=2.0)
    client = (
        redis_client(settings.redis)
        if make == "settings"
        else client_for_url(server.url, socket_timeout=2)
    )
    try:
        failures = await commands_after_restart(client, server)
        assert failures == []
        assert await client.get("k3") == b"3"  # the data came back (AOF), from the same client
    finally:
        await client.aclose()
        server.kill()
