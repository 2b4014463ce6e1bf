"""hiredis' C command packer for our asyncio Redis connections (the one place that swaps it in).

redis-py's synchronous connections pack commands with ``hiredis.pack_command`` when hiredis is
installed; its asyncio connections always use the pure-Python packer (redis/redis-py#4176). An
embedding fetch is one EVALSHA with a key per touched bucket, which the C packer packs several
times faster (docs/benchmarks.md).

The swap uses public redis-py API only: a subclass of each asyncio connection class overriding
``pack_command`` (``pack_commands``, used by pipelines, calls it per command), installed as the
client's ``connection_pool.connection_class`` before the pool makes its first connection. Only
arguments whose bytes both packers agree on take the C path (``str`` with the utf-8 strict
encoder, ``bytes``, ``int``); anything else (floats, memoryviews, other encodings) goes to
redis-py's own packer, so the bytes on the wire are the same either way (tested). Cluster
clients keep the Python packer: redis-py's ``RedisCluster`` takes no connection class.
Delete this module once redis-py's asyncio connections select hiredis themselves.
"""

from __future__ import annotations

from typing import Any

from hiredis import pack_command as _hiredis_pack
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

_C_TYPES = frozenset({str, bytes, int})  # exact types: bool (an int) must still be refused
_UTF8 = frozenset({"utf-8", "utf8", "UTF-8", "UTF8"})


class _HiredisPacking:
    """Mixin: ``pack_command`` through hiredis when every argument is a plain str/bytes/int."""

    encoder: Any

    def pack_command(self, *args: Any) -> list[bytes]:
        encoder = self.encoder
        if (
            encoder.encoding in _UTF8
            and encoder.encoding_errors == "strict"
            and _C_TYPES.issuperset(map(type, args))  # C speed: a batch write has ~1,500 args
        ):
            first = args[0]
            # redis-py splits a command name given with its subcommand ("CONFIG GET").
            if isinstance(first, str):
                if " " in first:
                    args = (*first.split(), *args[1:])
            elif isinstance(first, bytes) and b" " in first:
                args = (*first.split(), *args[1:])
            return [_hiredis_pack(args)]
        return super().pack_command(*args)  # type: ignore[misc]


class HiredisPackedConnection(_HiredisPacking, Connection):
    """A TCP connection packing commands with hiredis."""


class HiredisPackedSSLConnection(_HiredisPacking, SSLConnection):
    """A TLS connection packing commands with hiredis."""


class HiredisPackedUnixConnection(_HiredisPacking, UnixDomainSocketConnection):
    """A Unix-socket connection packing commands with hiredis."""


_FAST: dict[type, type] = {
    Connection: HiredisPackedConnection,
    SSLConnection: HiredisPackedSSLConnection,
    UnixDomainSocketConnection: HiredisPackedUnixConnection,
}


def use_hiredis_packer(client: Any) -> bool:
    """Make ``client`` (a plain asyncio ``Redis``, not yet connected) pack with hiredis;
    returns whether it does. Clients of other connection classes (Sentinel-managed ones) keep
    their own."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return False
    fast = _FAST.get(pool.connection_class)
    if fast is None:
        return pool.connection_class in _FAST.values()
    pool.connection_class = fast
    return True
