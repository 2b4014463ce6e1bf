"""A Redis master, its replica and three Sentinels on loopback, from the same redis-server binary
(``redis-server sentinel.conf --sentinel``): what the Sentinel tests fail over. Memory only;
each Sentinel needs a writable config file of its own (it records the failovers in it)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from streamrank.errors import StackError
from workbench.devstack.cluster import free_base_port, server_reply
from workbench.devstack.processes import ChildProcess, start_child
from workbench.devstack.servers import RedisServer
from workbench.devstack.services import HOST, redis_binary

MASTER_NAME = "mymaster"


class LocalSentinel:
    """``start()``, ``kill_master()`` (a crash), ``stop()``; ``settings()`` gives the
    ``redis_*`` settings a client finds the master with."""

    def __init__(self, *, run_dir: Path, down_after_ms: int = 1000) -> None:
        self.run_dir = Path(run_dir)
        self.down_after_ms = down_after_ms
        base = free_base_port(5)
        self.master_port, self.replica_port = base, base + 1
        self.sentinel_ports = [base + 2, base + 3, base + 4]
        self.servers: dict[int, RedisServer] = {}
        self.sentinels: list[ChildProcess] = []

    def settings(self) -> dict[str, Any]:
        return {
            # only the database (and password, TLS) of this URL count with Sentinels
            "STREAMRANK_REDIS_URL": f"redis://{HOST}:{self.master_port}/0",
            "STREAMRANK_REDIS_SENTINELS": tuple(f"{HOST}:{p}" for p in self.sentinel_ports),
            "STREAMRANK_REDIS_SENTINEL_MASTER": MASTER_NAME,
        }

    def start(self, timeout_s: float = 60.0) -> LocalSentinel:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            for port, extra in (
                (self.master_port, ()),
                (self.replica_port, ("--replicaof", HOST, str(self.master_port))),
            ):
                server = RedisServer(
                    port=port,
                    run_dir=self.run_dir,
                    persist="none",
                    extra_args=("--dbfilename", f"dump-{port}.rdb", *extra),
                )
                self.servers[port] = server
                server.start()
            for port in self.sentinel_ports:
                conf = self.run_dir / f"sentinel-{port}.conf"
                conf.write_text(
                    f"port {port}\nbind {HOST}\ndir {self.run_dir}\n"
                    f"sentinel monitor {MASTER_NAME} {HOST} {self.master_port} 2\n"
                    f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {MASTER_NAME} 10000\n"
                )
                self.sentinels.append(
                    start_child(
                        [redis_binary(), str(conf), "--sentinel"],
                        what="redis sentinel",
                        log_path=self.run_dir / f"sentinel-{port}.log",
                    )
                )
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        """Until the replica is in sync and every Sentinel sees the replica and the others
        (a failover needs a quorum of them to agree)."""
        deadline = time.monotonic() + timeout_s
        while True:
            synced = "master_link_status:up" in server_reply(
                self.replica_port, "INFO", "replication"
            )
            views = [self._master_view(p) for p in self.sentinel_ports]
            if synced and all(
                v.get("num-slaves") == "1" and v.get("num-other-sentinels") == "2" for v in views
            ):
                return
            if time.monotonic() > deadline:
                raise StackError(f"the Sentinels were not ready after {timeout_s:.0f}s: {views}")
            time.sleep(0.1)

    def _master_view(self, port: int) -> dict[str, str]:
        import redis

        client = redis.Redis(host=HOST, port=port, socket_timeout=1, decode_responses=True)
        try:
            reply = client.execute_command("SENTINEL", "MASTER", MASTER_NAME)
        except redis.RedisError:
            return {}
        finally:
            client.close()
        if isinstance(reply, dict):
            return {str(k): str(v) for k, v in reply.items()}
        return dict(zip(reply[::2], reply[1::2], strict=False))

    def current_master_port(self) -> int | None:
        """The master's port as the first Sentinel that answers reports it."""
        for port in self.sentinel_ports:
            view = self._master_view(port)
            if view.get("port"):
                return int(view["port"])
        return None

    def kill_master(self) -> None:
        """SIGKILL the master: the Sentinels promote the replica after ``down_after_ms``."""
        self.servers[self.master_port].kill()

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop(timeout_s=5)
        for server in self.servers.values():
            server.kill()
        self.sentinels.clear()
