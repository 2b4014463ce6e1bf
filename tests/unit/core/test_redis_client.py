"""Which client the settings make, and which Redis failures count as transient."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    ConnectionError,
    MasterDownError,
    MaxConnectionsError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)

from streamrank.errors import RedisUnavailable
from streamrank.redis.client import client_for_url, is_cluster, redis_client, url_of
from streamrank.redis.errors import is_transient, redis_call
from streamrank.settings import Settings


def test_a_cluster_url_scheme_or_the_setting_makes_a_cluster_client() -> None:
    by_scheme = Settings().with_env(STREAMRANK_REDIS_URL="redis+cluster://10.0.0.1:7000/0")
    assert by_scheme.redis.is_cluster and by_scheme.redis.dsn == "redis://10.0.0.1:7000/0"
    by_flag = Settings().with_env(
        STREAMRANK_REDIS_URL="rediss://:pw@10.0.0.1:7000/0", STREAMRANK_REDIS_CLUSTER=True
    )
    assert by_flag.redis.is_cluster and by_flag.redis.dsn == "rediss://:pw@10.0.0.1:7000/0"
    plain = Settings().with_env(STREAMRANK_REDIS_URL="redis://10.0.0.1:6379/0")
    assert not plain.redis.is_cluster
    for settings in (by_scheme, by_flag):
        client = redis_client(settings.redis)  # not connected yet: nothing is sent until used
        assert isinstance(client, RedisCluster) and is_cluster(client)
        assert url_of(settings.redis).partition("://")[0].endswith("+cluster")
    flagged = redis_client(by_flag.redis)
    kwargs = flagged.get_connection_kwargs()
    assert kwargs["password"] == "pw" and kwargs["socket_timeout"] == 0.25  # auth, TLS, timeouts
    assert flagged.retry.get_retries() == 1
    assert isinstance(redis_client(plain.redis), Redis) and not is_cluster(
        redis_client(plain.redis)
    )
    assert url_of(plain.redis) == "redis://10.0.0.1:6379/0"
    assert isinstance(client_for_url(url_of(by_scheme.redis)), RedisCluster)


def test_extra_startup_nodes_are_parsed_and_bad_ones_refused() -> None:
    settings = Settings().with_env(
        STREAMRANK_REDIS_URL="redis+cluster://10.0.0.1:7000/0",
        STREAMRANK_REDIS_CLUSTER_NODES="10.0.0.2:7001, 10.0.0.3:7002",
    )
    assert settings.redis.cluster_nodes == ("10.0.0.2:7001", "10.0.0.3:7002")
    names = {n.name for n in redis_client(settings.redis).nodes_manager.startup_nodes.values()}
    assert {"10.0.0.1:7000", "10.0.0.2:7001", "10.0.0.3:7002"} <= names
    bad = Settings().with_env(
        STREAMRANK_REDIS_URL="redis+cluster://h:1/0", STREAMRANK_REDIS_CLUSTER_NODES=("nohost",)
    )
    with pytest.raises(ValueError, match="host:port"):
        redis_client(bad.redis)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionError("refused"),
        BusyLoadingError("loading"),
        MaxConnectionsError("pool exhausted"),
        ClusterDownError("CLUSTERDOWN The cluster is down"),
        MasterDownError("MASTERDOWN Link with MASTER is down"),
        TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
        ClusterError("TTL exhausted."),
        MovedError("3999 127.0.0.1:6381"),
        AskError("3999 127.0.0.1:6381"),
        SlotNotCoveredError('Slot "5" is not covered by the cluster.'),
        RedisClusterException("Redis Cluster cannot be connected. Please provide at least one"),
    ],
)
def test_cluster_outages_are_transient(exc: Exception) -> None:
    assert is_transient(exc)
    with pytest.raises(RedisUnavailable, match="the thing"), redis_call("the thing"):
        raise exc


@pytest.mark.parametrize(
    "exc",
    [
        ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        NoScriptError("NOSCRIPT No matching script"),
        RedisClusterException("EVALSHA - all keys must map to the same key slot"),
        RedisClusterException("Cluster mode is not enabled on this node"),
        ValueError("a bug"),
    ],
)
def test_bugs_and_bad_data_are_not_transient(exc: Exception) -> None:
    assert not is_transient(exc)
    with pytest.raises(type(exc)), redis_call("the thing"):
        raise exc
