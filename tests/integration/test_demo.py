"""`streamrank demo` as `make demo` runs it: it starts its own stack, runs, and stops what it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from streamrank.stack import free_port, port_in_use


def test_demo_runs_and_ctrl_c_stops_everything_it_started(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")}
    kafka_port, redis_port = free_port(), free_port()
    env.update(
        STREAMRANK_RUN_DIR=str(tmp_path / "run"),
        STREAMRANK_STACK_KAFKA_PORT=str(kafka_port),
        STREAMRANK_STACK_REDIS_PORT=str(redis_port),
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrank.cli", "demo"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "consumed" in line and "demo: produced" in line:
            break
    assert any("demo: produced" in line for line in lines), "".join(lines)
    assert port_in_use(kafka_port) and port_in_use(redis_port)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(lines) + out
    assert "demo: stopped kafka, redis" in out
    assert not port_in_use(kafka_port) and not port_in_use(redis_port)
