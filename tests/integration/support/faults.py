"""Fault injection for the reliability tests: a TCP proxy that can drop a reply, and waits on
Redis replication (failover)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any


class ReplyDroppingProxy:
    """A TCP proxy on a free loopback port in front of ``upstream_port``.

    After :meth:`drop_next_reply`, the next bytes the server sends back on any connection are
    thrown away and that connection is reset: the server did the work, the client never hears
    of it (a connection lost mid-reply)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.dropped = 0
        self._drop = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ReplyDroppingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def drop_next_reply(self) -> None:
        self._drop = True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, replies: bool) -> None:
            while data := await src.read(65536):
                if replies and self._drop:
                    self._drop = False
                    self.dropped += 1
                    for w in (writer, up_writer):
                        w.transport.abort()
                    return
                dst.write(data)
                await dst.drain()
            dst.close()

        tasks = [
            asyncio.ensure_future(pump(reader, up_writer, replies=False)),
            asyncio.ensure_future(pump(up_reader, writer, replies=True)),
        ]
        self._tasks.update(tasks)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._tasks.difference_update(tasks)
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()


def wait_replicated(master: Any, replica: Any, *, timeout_s: float = 20.0) -> None:
    """Until ``replica`` (a sync client) has applied everything ``master`` has written."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = replica.info("replication")
        if info.get("master_link_status") == "up":
            wanted = int(master.info("replication")["master_repl_offset"])
            if int(info.get("slave_repl_offset", -1)) >= wanted:
                return
        time.sleep(0.05)
    raise AssertionError(f"the replica did not catch up within {timeout_s}s")
