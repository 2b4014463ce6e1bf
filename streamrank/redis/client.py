"""Every Redis client of ours is made here, from the settings: the URL, timeouts, TLS, and
whether Redis is one server, one server found through Sentinel, or a cluster. Callers do not care which they got: the key contract
(:mod:`streamrank.keys`) keeps every multi-key command in one hash slot, and
:mod:`streamrank.redis.pipeline` sends a batch as one pipeline per node either way. The few
commands that address servers rather than keys (CONFIG, INFO, SCAN) take
:func:`on_each_server`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError

from streamrank.redis.packing import use_hiredis_packer
from streamrank.settings import RedisSettings

CLUSTER_RETRIES = 1


def reconnect_once() -> Retry:
    """A command that fails on a dead connection is sent once more, on a new one (redis-py's
    clients from a URL retry nothing). After a Redis restart every pooled connection is dead,
    and the pool hands out the least used ones last: without this, one batch in a burst many
    seconds later still failed (``Connection closed by server``). Timeouts are not retried: a
    caller's deadline is its own. Safe because every write of ours is idempotent."""
    return Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


def redis_client(redis: RedisSettings, *, timeout_s: float | None = None, **options: Any) -> Any:
    """An asyncio client on the configured Redis (bytes replies): a ``RedisCluster`` when
    ``redis.is_cluster``, else a plain ``Redis``. ``timeout_s`` overrides the socket
    timeout of its calls (long batch writes, benchmarks); ``options`` are redis-py's."""
    kwargs = redis.client_kwargs()
    if timeout_s is not None:
        kwargs["socket_timeout"] = timeout_s
    kwargs.update(options)
    if redis.is_cluster:
        return cluster_client(redis.dsn, redis.cluster_nodes, **kwargs)
    if redis.sentinels:
        password = redis.sentinel_password
        return sentinel_client(
            redis.dsn,
            redis.sentinels,
            redis.sentinel_master,
            sentinel_password=password.get_secret_value() if password else None,
            **kwargs,
        )
    return _plain_client(redis.dsn, **kwargs)


def sentinel_client(
    url: str,
    sentinels: tuple[str, ...],
    master: str,
    *,
    sentinel_password: str | None = None,
    **kwargs: Any,
) -> aioredis.Redis:
    """A client on the master the Sentinels name ``master``: it asks them for the master's
    address on connecting, and again when the master stops answering or turns out to be a
    replica (a failover). ``url`` gives the master's password, database and TLS (its host and
    port are not used)."""
    from redis.asyncio.sentinel import Sentinel

    params: dict[str, Any] = dict(parse_url(url))
    params.pop("host", None)
    params.pop("port", None)
    if params.pop("connection_class", None) is SSLConnection:
        params["ssl"] = True
    params.update(kwargs)
    params.setdefault("retry", reconnect_once())
    sentinel_kwargs = {k: v for k, v in params.items() if k.startswith("socket_")}
    if sentinel_password:
        sentinel_kwargs["password"] = sentinel_password
    manager = Sentinel(
        [_host_port(node) for node in sentinels], sentinel_kwargs=sentinel_kwargs, **params
    )
    return manager.master_for(master)


def url_of(redis: RedisSettings) -> str:
    """The configured Redis as one URL (``redis+cluster://`` for a cluster): what
    :func:`client_for_url` and a child process's ``STREAMRANK_REDIS_URL`` take."""
    url = redis.dsn
    if redis.is_cluster:
        scheme, _sep, rest = url.partition("://")
        return f"{scheme}+cluster://{rest}"
    return url


def client_for_url(url: str, **kwargs: Any) -> Any:
    """A client on ``url`` (``redis+cluster://`` / ``rediss+cluster://``: a cluster client), for
    tools given a URL rather than settings; ``kwargs`` are redis-py's."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.endswith("+cluster"):
        return cluster_client(f"{scheme.removesuffix('+cluster')}://{rest}", **kwargs)
    return _plain_client(url, **kwargs)


def _plain_client(url: str, **kwargs: Any) -> aioredis.Redis:
    """A client on one server, packing its commands with hiredis (streamrank.redis.packing)."""
    kwargs.setdefault("retry", reconnect_once())
    client = aioredis.from_url(url, **kwargs)
    use_hiredis_packer(client)
    return client


def cluster_client(url: str, extra_nodes: tuple[str, ...] = (), **kwargs: Any) -> RedisCluster:
    """A cluster client on ``url`` (and ``extra_nodes``, ``host:port``) that keeps serving the
    slots that have a master while others have none (``require_full_coverage=False``: a
    request for a slot without a master fails alone, with ``ClusterDownError``)."""
    startup = [ClusterNode(*_host_port(node)) for node in extra_nodes]
    kwargs.setdefault("require_full_coverage", False)
    # One retry (with a fresh slot map) inside redis-py, then the error: our callers retry with
    # back-off (features) or reply degraded (scoring); redis-py's default retries would hold a
    # batch for seconds while a slot has no master (docs/scaling.md, "What the client handles").
    kwargs.setdefault("retry", Retry(NoBackoff(), CLUSTER_RETRIES))
    return RedisCluster.from_url(url, startup_nodes=startup or None, **kwargs)


def _host_port(node: str) -> tuple[str, int]:
    host, sep, port = node.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"a Redis node must be host:port, got {node!r}")
    return host, int(port)


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster."""
    return isinstance(client, RedisCluster)


def slot_of_tag(tag: str) -> int:
    """The hash slot of the keys with hash tag ``tag`` (given with its braces)."""
    return int(key_slot(tag.encode("utf-8")))


def slot_grouping(client: Any) -> Callable[[str], int] | None:
    """How to group the keys of one batch into calls that may run as one: by hash slot on a
    cluster, or None (everything together) on a single server."""
    return slot_of_tag if is_cluster(client) else None


async def on_each_server(client: Any, *args: Any, replicas: bool = False) -> list[Any]:
    """Run a server command (CONFIG GET/SET, INFO, WAIT...) on every master of a cluster (and
    every replica too with ``replicas``: a replica promoted later must have the same setting),
    or on the one server; one reply per server."""
    if not is_cluster(client):
        return [await client.execute_command(*args)]
    await client.initialize()
    nodes = client.get_nodes() if replicas else client.get_primaries()
    return list(
        await asyncio.gather(*(client.execute_command(*args, target_nodes=n) for n in nodes))
    )


async def used_memory(client: Any) -> int:
    """Bytes of memory in use (``INFO memory`` used_memory), summed over a cluster's masters."""
    return sum(int(info["used_memory"]) for info in await on_each_server(client, "INFO", "memory"))


async def unlink_matching(client: Any, pattern: str, *, batch: int = 1000) -> int:
    """UNLINK every key matching ``pattern`` (SCAN in ``batch``-sized steps; every master of a
    cluster); returns how many were deleted."""
    deleted = 0
    chunk: list[Any] = []
    async for key in client.scan_iter(match=pattern, count=batch):
        chunk.append(key)
        if len(chunk) >= batch:
            deleted += await client.unlink(*chunk)
            chunk = []
    if chunk:
        deleted += await client.unlink(*chunk)
    return deleted
