"""The embedded stack for the demo and tests: a Tansu Kafka-compatible broker and a Redis server.

Both run as child processes in their own session (they outlive the CLI that started them),
bound to loopback only, memory-only. Their pid, log and state files live under one run
directory; ``down`` stops only the processes whose pid files ``up`` wrote and whose command line
still matches, so a recycled pid is never killed.

Production never uses this: point ``STREAMRANK_KAFKA_BOOTSTRAP`` and ``STREAMRANK_REDIS_URL`` at
real clusters instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from streamrank.errors import StackError
from streamrank.settings import Settings
from workbench.devstack import cluster
from workbench.devstack.processes import start_child
from workbench.devstack.servers import TANSU_ENV
from workbench.devstack.services import (
    HOST,
    ServiceSpec,
    cmdline_of,
    free_port,
    kafka_answers,
    kafka_spec,
    pid_alive,
    port_in_use,
    redis_answers,
    redis_spec,
)

logger = logging.getLogger(__name__)

CLUSTER_REPLICAS = 1  # the embedded Redis Cluster: 3 masters with one replica each
CLUSTER_NODES = 3 * (1 + CLUSTER_REPLICAS)


class EmbeddedStack:
    """Start, stop and inspect the embedded broker and Redis under one run directory.

    ``redis_cluster``: Redis is a local Redis Cluster (:mod:`workbench.devstack.cluster`: 3
    masters and 3 replicas on ``redis_port`` .. ``redis_port + 5``) instead of one server;
    None: whatever this run directory's stack was started as (so ``down`` and ``status`` need
    no flag)."""

    def __init__(
        self,
        *,
        run_dir: Path,
        kafka_port: int,
        redis_port: int,
        redis_cluster: bool | None = None,
        node_timeout_ms: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.kafka_port = kafka_port
        self.redis_port = redis_port
        marker = self._cluster_marker.exists()
        self.redis_cluster = marker if redis_cluster is None else redis_cluster
        self.node_timeout_ms = node_timeout_ms or cluster.DEFAULT_NODE_TIMEOUT_MS

    @classmethod
    def on_free_ports(cls, run_dir: Path, *, redis_cluster: bool = False) -> EmbeddedStack:
        """A stack on free ports (a cluster's nodes on consecutive ports with free bus ports)."""
        redis_port = cluster.free_base_port(CLUSTER_NODES) if redis_cluster else free_port()
        return cls(
            run_dir=run_dir, kafka_port=free_port(), redis_port=redis_port,
            redis_cluster=redis_cluster,
        )  # fmt: skip

    def settings_for(self, settings: Settings) -> Settings:
        """``settings`` pointed at this stack."""
        env = self.client_env()
        nodes = env.get("STREAMRANK_REDIS_CLUSTER_NODES")
        return settings.with_env(
            STREAMRANK_KAFKA_BOOTSTRAP=self.bootstrap,
            STREAMRANK_REDIS_URL=SecretStr(self.redis_url),
            STREAMRANK_REDIS_CLUSTER=False,  # the URL says it
            STREAMRANK_REDIS_CLUSTER_NODES=tuple(nodes.split(",")) if nodes else (),
            STREAMRANK_REDIS_SENTINELS=(),
        )

    @property
    def _cluster_marker(self) -> Path:
        return self.run_dir / "redis-cluster"

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.kafka_port}"

    @property
    def redis_ports(self) -> list[int]:
        """The Redis server's port, or the cluster nodes' (masters first, then replicas)."""
        if self.redis_cluster:
            return list(range(self.redis_port, self.redis_port + CLUSTER_NODES))
        return [self.redis_port]

    @property
    def redis_url(self) -> str:
        scheme = "redis+cluster" if self.redis_cluster else "redis"
        return f"{scheme}://{HOST}:{self.redis_port}/0"

    def client_env(self) -> dict[str, str]:
        """The settings that point a client at this stack (``STREAMRANK_*`` variables)."""
        env = {"STREAMRANK_KAFKA_BOOTSTRAP": self.bootstrap, "STREAMRANK_REDIS_URL": self.redis_url}
        if self.redis_cluster:  # the other nodes, for a client started while the first is down
            env["STREAMRANK_REDIS_CLUSTER_NODES"] = ",".join(
                f"{HOST}:{p}" for p in self.redis_ports[1:]
            )
        return env

    def _pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def _log_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.log"

    def _specs(self) -> list[ServiceSpec]:
        specs = [kafka_spec(self.kafka_port)]
        if not self.redis_cluster:
            return [*specs, redis_spec(self.redis_port, self.run_dir)]
        for port in self.redis_ports:
            argv = redis_spec(port, self.run_dir).argv
            argv += cluster.cluster_args(port, self.run_dir, node_timeout_ms=self.node_timeout_ms)
            specs.append(ServiceSpec(f"redis-{port}", port, argv))
        return specs

    def _running_pid(self, spec: ServiceSpec) -> int | None:
        """The pid of our process for this service, or None; removes a stale pid file."""
        pid_file = self._pid_file(spec.name)
        if not pid_file.exists():
            return None
        try:
            pid = int(pid_file.read_text().split()[0])
        except (ValueError, IndexError):
            logger.warning("removing unreadable pid file %s", pid_file)
            pid_file.unlink()
            return None
        cmdline = cmdline_of(pid)
        if not pid_alive(pid):  # gone, exiting, or a zombie nobody reaped: not a foreign process
            logger.warning("removing stale pid file %s (pid %s is not running)", pid_file, pid)
            pid_file.unlink()
            return None
        if Path(spec.binary).name.split("-")[0] not in cmdline:
            raise StackError(
                f"{pid_file} names pid {pid}, which runs {cmdline!r}, not the embedded {spec.name}; "
                "the pid file is stale: delete it and run `streamrank stack up` again"
            )
        return pid

    def _answers(self, spec: ServiceSpec) -> bool:
        if spec.name == "kafka":
            return port_in_use(self.kafka_port) and kafka_answers(self.bootstrap)
        return redis_answers(f"redis://{HOST}:{spec.port}/0")

    def _check_mode(self) -> None:
        """Refuse to start one kind of Redis where the other kind of this stack runs."""
        other = EmbeddedStack(
            run_dir=self.run_dir, kafka_port=self.kafka_port, redis_port=self.redis_port,
            redis_cluster=not self.redis_cluster,
        )  # fmt: skip
        running = [s.name for s in other._specs()[1:] if other._running_pid(s) is not None]
        if running:
            kind = "a single Redis" if self.redis_cluster else "a Redis Cluster"
            raise StackError(
                f"{kind} of this stack is running in {self.run_dir} ({', '.join(running)}); "
                "run `streamrank stack down` first"
            )

    def up(self, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """Start what is not running (idempotent) and wait until every service answers (and, for
        a cluster, until it is formed and ``cluster_state:ok``)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._check_mode()
        started: list[str] = []
        for spec in self._specs():
            if self._running_pid(spec) is not None:
                logger.info(
                    "%s already running (pid file %s)", spec.name, self._pid_file(spec.name)
                )
                continue
            service = spec.name.split("-")[0]
            busy = port_in_use(spec.port)
            if self.redis_cluster and service == "redis":
                busy = busy or not cluster.ports_free([spec.port])
                cluster.forget_config(self.run_dir, [spec.port])  # a fresh node
            if busy:
                raise StackError(
                    f"port {spec.port} on {HOST} is already in use (a cluster node also needs "
                    f"port + {cluster.BUS_OFFSET}), so the embedded {spec.name} cannot start; "
                    "stop whatever listens there or choose another port "
                    f"(STREAMRANK_STACK_{service.upper()}_PORT or --{service}-port)"
                )
            env = {k: v for k, v in os.environ.items() if k not in TANSU_ENV}
            proc = start_child(
                spec.argv,
                what=f"embedded {spec.name}",
                log_path=self._log_file(spec.name),
                env=env,
                cwd=self.run_dir,
                new_session=True,
            )
            self._pid_file(spec.name).write_text(f"{proc.pid}\n")
            started.append(spec.name)
            logger.info("started %s (pid %s) on %s:%s", spec.name, proc.pid, HOST, spec.port)
        deadline = time.monotonic() + timeout_s
        for spec in self._specs():
            while not self._answers(spec):
                pid = self._running_pid(spec)
                if pid is None:
                    raise StackError(
                        f"the embedded {spec.name} exited during start-up; see {self._log_file(spec.name)}"
                    )
                if time.monotonic() > deadline:
                    raise StackError(
                        f"the embedded {spec.name} did not answer within {timeout_s:.0f}s; "
                        f"see {self._log_file(spec.name)}"
                    )
                time.sleep(0.1)
        if self.redis_cluster:
            self._cluster_marker.write_text(" ".join(map(str, self.redis_ports)) + "\n")
            left = max(1.0, deadline - time.monotonic())
            if not cluster.is_formed(self.redis_port):
                cluster.create(self.redis_ports, replicas=CLUSTER_REPLICAS, timeout_s=left)
            else:
                cluster.wait_ready(self.redis_ports, replicas=CLUSTER_REPLICAS, timeout_s=left)
        status = self.status()
        status["started"] = started
        return status

    def down(self, *, timeout_s: float = 10.0) -> list[str]:
        """Stop the processes this run directory's pid files name; return the services stopped."""
        stopped: list[str] = []
        for spec in self._specs():
            pid = self._running_pid(spec)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):  # exited since it was looked up
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(pid):
                logger.warning("%s (pid %s) ignored SIGTERM; sending SIGKILL", spec.name, pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while pid_alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # our own child (the test fixture's): reap it
            if pid_alive(pid):
                raise StackError(
                    f"{spec.name} (pid {pid}) did not exit even after SIGKILL (stuck in the "
                    f"kernel?); {self._pid_file(spec.name)} is kept: check `ps -o stat {pid}`"
                )
            self._pid_file(spec.name).unlink(missing_ok=True)
            stopped.append(spec.name)
        if self.redis_cluster:
            cluster.forget_config(self.run_dir, self.redis_ports)
            self._cluster_marker.unlink(missing_ok=True)
        return stopped

    def status(self) -> dict[str, Any]:
        """``{"kafka": {"bootstrap", "up"}, "redis": {"url", "up", "mode"}}`` for the stack's
        ports; a cluster's also has ``state`` and ``nodes`` (address, role, slots, up, pid)."""
        specs = self._specs()
        kafka = {"bootstrap": self.bootstrap, "up": self._answers(specs[0])}
        if not self.redis_cluster:
            redis = {"url": self.redis_url, "up": self._answers(specs[1]), "mode": "standalone"}
            return {"kafka": kafka, "redis": redis}
        pids = {spec.port: self._running_pid(spec) for spec in specs[1:]}
        redis = {"url": self.redis_url, **cluster.cluster_status(self.redis_ports, pids)}
        return {"kafka": kafka, "redis": redis}


def stack_from(settings: Settings, *, redis_cluster: bool | None = None) -> EmbeddedStack:
    """The embedded stack of ``settings``' run directory and ports."""
    return EmbeddedStack(
        run_dir=settings.tools.run_dir,
        kafka_port=settings.tools.stack_kafka_port,
        redis_port=settings.tools.stack_redis_port,
        redis_cluster=redis_cluster,
    )
