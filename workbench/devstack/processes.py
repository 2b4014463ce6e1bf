"""The one way streamrank starts child processes: the embedded stack's services and private
Redis servers (:mod:`workbench.devstack.stack`), and workers (for the demo, replay, benchmarks
and tests).

:func:`start_child` is the only ``Popen`` of the project: output to a log file (or inherited),
stdin closed, an environment of our choosing. :class:`ChildProcess` stops what it started:
SIGTERM, then SIGKILL after a timeout, and always reaps the child. :func:`run_tool` runs a
short command to completion (``redis-cli --cluster create``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from streamrank.errors import StackError, StreamrankError
from streamrank.settings import Settings

SCORING_READY = "scoring worker consuming"  # logged by ScoringWorker.start once it consumes
FEATURES_READY = "Worker ready"  # logged by Faust once the features worker is assigned
OUTCOMES_READY = "outcomes worker consuming"  # logged by OutcomesWorker.start
READY = {"features": FEATURES_READY, "scoring": SCORING_READY, "outcomes": OUTCOMES_READY}


@dataclass
class ChildProcess:
    """A child process we started, and where its output goes (``log_start``: the log's size
    when it started, since logs are appended to across runs)."""

    process: subprocess.Popen[bytes]
    log_path: Path | None
    what: str
    log_start: int = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        """What this child wrote: an earlier run's lines in the same log never count (its
        ready line would pass for this child's)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(self.log_start)
            return log.read().decode(errors="replace")

    def wait_logged(self, marker: str, *, timeout_s: float) -> None:
        """Wait until the log shows ``marker``; a clear error if the child exits or stays silent."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if marker in self.log_text():
                return
            if not self.alive():
                raise StreamrankError(
                    f"the {self.what} (pid {self.pid}) exited during start-up; its log "
                    f"{self.log_path} ends with:\n{self.log_text()[-3000:]}"
                )
            time.sleep(0.1)
        raise StreamrankError(
            f"the {self.what} (pid {self.pid}) was not ready after {timeout_s:.0f}s; "
            f"see {self.log_path}"
        )

    def kill(self) -> None:
        """SIGKILL: a crash, nothing is flushed or committed."""
        if self.alive():
            self.process.kill()
        self.process.wait(10)

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return int(self.process.returncode)


@dataclass
class WorkerProcess(ChildProcess):
    """A ``streamrank worker KIND`` child process."""

    kind: str = "features"

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the worker consumes (features: joined its group and got partitions)."""
        self.wait_logged(READY[self.kind], timeout_s=timeout_s)


def start_child(
    argv: Sequence[str],
    *,
    what: str,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    new_session: bool = False,
) -> ChildProcess:
    """Start ``argv``; its output is appended to ``log_path`` (inherited when None).
    ``new_session``: the child outlives us and our terminal's Ctrl-C (the embedded stack)."""
    log = None
    log_start = 0
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("ab")
        log_start = log.seek(0, os.SEEK_END)
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT if log is not None else None,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=new_session,
        )
    except OSError as exc:
        raise StackError(f"could not start the {what} ({argv[0]}): {exc}") from exc
    finally:
        if log is not None:
            log.close()  # the child holds its own descriptor
    return ChildProcess(process, log_path, what, log_start)


def run_tool(argv: Sequence[str], *, what: str, timeout_s: float = 60.0) -> str:
    """Run a short command to completion; its output (stdout then stderr), or StackError naming
    ``what`` with the output when it fails or outlasts ``timeout_s``."""
    try:
        done = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(f"could not run {what} ({argv[0]}): {exc}") from exc
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise StackError(f"{what} exited with {done.returncode}:\n{output[-3000:]}")
    return output


def worker_env(settings: Settings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without STREAMRANK_* variables, plus every field of
    ``settings`` (and ``extra``): what a worker child reads its settings from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")}
    env.update(settings.as_env())
    if settings.observability.log_level.upper() not in ("DEBUG", "INFO"):
        env["STREAMRANK_LOG_LEVEL"] = "INFO"  # the ready markers are INFO lines
    env.update(extra or {})
    return env


def start_command(
    args: Sequence[str],
    settings: Settings,
    *,
    log_path: Path,
    what: str,
    extra_env: Mapping[str, str] | None = None,
) -> ChildProcess:
    """Start ``streamrank ARGS...`` with every field of ``settings`` handed over through the
    environment (workers, the load driver)."""
    argv = [sys.executable, "-m", "workbench.cli", *args]
    return start_child(argv, what=what, log_path=log_path, env=worker_env(settings, extra_env))


def start_worker(
    kind: str,
    settings: Settings,
    *,
    log_path: Path,
    metrics_port: int | None = 0,
    extra_env: Mapping[str, str] | None = None,
) -> WorkerProcess:
    """Start ``streamrank worker KIND`` (features or scoring) with every field of ``settings``
    handed over through the environment; ``metrics_port`` None leaves it to the settings."""
    args = ["worker", kind]
    if metrics_port is not None:
        args += ["--metrics-port", str(metrics_port)]
    child = start_command(
        args, settings, log_path=log_path, what=f"{kind} worker", extra_env=extra_env
    )
    return WorkerProcess(**vars(child), kind=kind)
