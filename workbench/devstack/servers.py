"""Private servers for fault tests and benchmarks: a redis-server and a Tansu broker that can
be stopped, started again, paused (SIGSTOP: a hung server) and resumed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from streamrank.errors import StackError
from workbench.devstack.processes import ChildProcess, start_child
from workbench.devstack.services import (
    HOST,
    free_port,
    kafka_answers,
    kafka_spec,
    port_in_use,
    redis_answers,
    redis_spec,
)


class _Pausable:
    """A private server process that can hang and come back: SIGSTOP keeps its connections
    open and answers nothing; SIGCONT resumes it."""

    child: ChildProcess | None

    def pause(self) -> None:
        if self.child is not None and self.child.alive():
            os.kill(self.child.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.child is not None and self.child.alive():
            os.kill(self.child.pid, signal.SIGCONT)


class RedisServer(_Pausable):
    """A private redis-server on ``port`` that can be stopped and started again with its data:
    ``persist="aof"`` (append-only, fsync always), ``"rdb"`` (a SAVE before each stop) or
    ``"none"`` (memory only). ``password`` turns on AUTH (``requirepass``); ``extra_args`` are
    more redis-server options (``--key-load-delay 50`` makes a restart load slowly, ...)."""

    def __init__(
        self,
        *,
        port: int,
        run_dir: Path,
        persist: str = "rdb",
        password: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.port = port
        self.run_dir = Path(run_dir)
        self.persist = persist
        self.password = password
        self.extra_args = tuple(extra_args)
        self.child: ChildProcess | None = None

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.child.process if self.child is not None else None

    def client(self) -> Any:
        """A synchronous client on this server (bytes replies)."""
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=10)

    def start(self, timeout_s: float = 20.0, *, wait_loaded: bool = True) -> None:
        """Start it and wait until it answers PING; ``wait_loaded=False`` returns as soon as it
        accepts connections, while it may still be loading its data (answering ``LOADING``)."""
        argv = list(redis_spec(self.port, self.run_dir).argv)
        if self.persist == "aof":
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        if self.password:
            argv += ["--requirepass", self.password]
        argv += self.extra_args
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.child = start_child(
            argv, what="private redis-server", log_path=self.run_dir / f"redis-{self.port}.log"
        )
        deadline = time.monotonic() + timeout_s
        while not (port_in_use(self.port) if not wait_loaded else redis_answers(self.url, 0.5)):
            if not self.child.alive() or time.monotonic() > deadline:
                raise StackError(
                    f"the private redis-server on {self.port} did not start; see "
                    f"{self.child.log_path}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop it, keeping its data for the next :meth:`start`."""
        if self.child is None:
            return
        if self.persist == "rdb" and self.child.alive():
            client = self.client()
            try:
                client.save()
            finally:
                client.close()
        self.child.stop(timeout_s=10)
        self.child = None

    def kill(self) -> None:
        """SIGKILL: a crash (with ``persist="aof"`` nothing acknowledged is lost)."""
        if self.child is not None:
            self.child.kill()
            self.child = None


class KafkaBroker(_Pausable):
    """A private embedded broker (Tansu, memory only) on ``port``, for fault tests: it can be
    stopped, started again (empty), paused (SIGSTOP: a hung broker) and resumed."""

    def __init__(self, *, port: int, run_dir: Path) -> None:
        self.port = port
        self.run_dir = Path(run_dir)
        self.child: ChildProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        env = {k: v for k, v in os.environ.items() if k not in TANSU_ENV}
        self.child = start_child(
            kafka_spec(self.port).argv,
            what="private kafka broker",
            log_path=self.run_dir / f"kafka-{self.port}.log",
            env=env,
            cwd=self.run_dir,
        )
        deadline = time.monotonic() + timeout_s
        while not (port_in_use(self.port) and kafka_answers(self.bootstrap)):
            if not self.child.alive() or time.monotonic() > deadline:
                raise StackError(
                    f"the private broker on {self.port} did not start; see {self.child.log_path}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        if self.child is not None:
            self.resume()
            self.child.stop(timeout_s=10)
            self.child = None


@contextmanager
def private_redis(
    run_dir: Path,
    *,
    persist: str = "rdb",
    password: str | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[RedisServer]:
    """A private redis-server on a free port for the body; gone afterwards."""
    server = RedisServer(
        port=free_port(), run_dir=run_dir, persist=persist, password=password, extra_args=extra_args
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


# Tansu reads these from the environment; a stray value must not reconfigure our broker.
TANSU_ENV = frozenset(
    {"CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY"}
)
