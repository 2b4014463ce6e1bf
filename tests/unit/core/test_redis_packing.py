"""The hiredis packer puts the same bytes on the wire as redis-py's own, and is installed on
plain clients only."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from streamrank.redis.client import client_for_url
from streamrank.redis.packing import (
    HiredisPackedConnection,
    HiredisPackedSSLConnection,
    HiredisPackedUnixConnection,
    use_hiredis_packer,
)


def wire(conn: Connection, *args: object) -> bytes:
    return b"".join(bytes(part) for part in conn.pack_command(*args))


PLAIN = Connection()
FAST = HiredisPackedConnection()

scalars = st.one_of(st.text(), st.binary(), st.integers(min_value=-(2**63), max_value=2**63 - 1))


@given(st.lists(scalars, max_size=80))
def test_any_str_bytes_int_arguments_pack_to_the_same_bytes(rest: list[object]) -> None:
    args = ("EVALSHA", *rest)
    assert wire(FAST, *args) == wire(PLAIN, *args)


@pytest.mark.parametrize(
    "args",
    [
        ("CONFIG GET", "maxmemory"),
        (b"CLIENT SETNAME", b"x"),
        ("SET", "k", 1.5),  # floats: redis-py's repr, not hiredis' formatting
        ("SET", "k", memoryview(b"abc")),
        ("SET", "k", bytearray(b"abc")),
        ("SET", "k", "x" * 10_000),  # redis-py splits large values into separate buffers
        ("HSET", "h", "\u00e9\u4e2d", b"\x00\xff"),
    ],
)
def test_special_arguments_pack_like_redis_py(args: tuple[object, ...]) -> None:
    assert wire(FAST, *args) == wire(PLAIN, *args)


def test_invalid_arguments_fail_like_redis_py() -> None:
    for bad in (True, None, object()):
        with pytest.raises(DataError):
            FAST.pack_command("SET", "k", bad)


def test_another_encoding_uses_redis_py_s_packer() -> None:
    latin = HiredisPackedConnection(encoding="latin-1")
    assert wire(latin, "SET", "k", "\u00e9") == wire(
        Connection(encoding="latin-1"), "SET", "k", "\u00e9"
    )
    assert wire(latin, "SET", "k", "\u00e9") != wire(FAST, "SET", "k", "\u00e9")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://localhost:6379/0", HiredisPackedConnection),
        ("rediss://localhost:6380/0", HiredisPackedSSLConnection),
        ("unix:///tmp/redis.sock", HiredisPackedUnixConnection),
    ],
)
def test_plain_clients_pack_with_hiredis(url: str, expected: type) -> None:
    client = client_for_url(url)
    assert client.connection_pool.connection_class is expected
    assert use_hiredis_packer(client)  # idempotent


def test_cluster_and_unknown_connection_classes_are_left_alone() -> None:
    cluster = client_for_url("redis+cluster://localhost:7000")
    assert not use_hiredis_packer(cluster)

    class Custom(Connection):
        pass

    client = aioredis.Redis(connection_pool=aioredis.ConnectionPool(connection_class=Custom))
    assert not use_hiredis_packer(client)
    assert client.connection_pool.connection_class is Custom
