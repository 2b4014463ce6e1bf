"""Starting and stopping features workers as child processes (the demo, tests, benchmark)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from streamrank.errors import StreamrankError
from streamrank.settings import Settings


@dataclass
class WorkerHandle:
    """A running ``streamrank worker features`` child process."""

    process: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until the worker has joined its group and been assigned partitions."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "Worker ready" in self.log_text():
                return
            if not self.alive():
                raise RuntimeError(f"features worker exited early; log:\n{self.log_text()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"features worker not ready after {timeout_s}s; see {self.log_path}")

    def kill(self) -> None:
        """SIGKILL: a crash, nothing is flushed or committed."""
        if self.alive():
            self.process.kill()
        self.process.wait(10)
        self._log.close()

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        return int(self.process.returncode)


def start_features_worker(
    settings: Settings, *, log_path: Path, extra_env: dict[str, str] | None = None
) -> WorkerHandle:
    """Start ``streamrank worker features`` with ``settings`` (every field, through the
    environment); its output goes to ``log_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")}
    env.update(settings.as_env())
    env.update(extra_env or {})
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "streamrank.cli", "worker", "features"],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    return WorkerHandle(process, log_path, log)


async def watch_sequence(
    settings: Settings, user_id: str, *, every_s: float = 2.0, rounds: int | None = None
) -> None:
    """Print one user's sequence length and newest items every ``every_s`` (the demo's view)."""
    from streams.worker import read_user_features

    count = 0
    while rounds is None or count < rounds:
        try:
            features = await read_user_features(settings, user_id)
        except StreamrankError as exc:
            print(f"features: cannot read user {user_id} yet: {exc}")
        else:
            newest = [e["item_id"] for e in features["sequence"][-5:]]
            counters = features["counters"]
            print(
                f"features: user {user_id} has {len(features['sequence'])} events "
                f"(newest {newest}); clicks 1h {counters['clicks_1h']}, "
                f"24h {counters['clicks_24h']}"
            )
        count += 1
        await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def features_demo(
    settings: Settings, *, user_id: str = "u0", every_s: float = 2.0, log_path: Path | None = None
) -> AsyncIterator[WorkerHandle]:
    """For ``streamrank demo``: run a features worker (child process) and print ``user_id``'s
    sequence growing every ``every_s`` while the body runs; stop both on exit."""
    log_path = log_path or Path(settings.run_dir) / "features-worker.log"
    handle = start_features_worker(settings, log_path=log_path)
    watcher: asyncio.Task[None] | None = None
    try:
        await asyncio.to_thread(handle.wait_ready, 120)
        print(f"features: worker pid {handle.pid} ready (log {log_path})")
        watcher = asyncio.create_task(watch_sequence(settings, user_id, every_s=every_s))
        yield handle
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await asyncio.to_thread(handle.stop)
