"""A command killed with SIGTERM (kill, timeout, a CI runner) stops what it started: a
benchmark's private broker and Redis used to outlive it and keep a core busy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def children_of(pid: int) -> set[int]:
    """Every live process whose parent is ``pid``, and theirs (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_stops_a_benchmark_s_private_stack(tmp_path: Path) -> None:
    env = dict(os.environ)
    # nothing answers there, so the benchmark starts a private embedded stack of its own
    env.update(
        STREAMRANK_KAFKA_BOOTSTRAP="127.0.0.1:9", STREAMRANK_REDIS_URL="redis://127.0.0.1:9/0"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "bench", "streams", "--events", "200000"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        for line in proc.stderr:
            if "starting a private embedded stack" in line or time.monotonic() > deadline:
                break
        time.sleep(5)  # the broker and Redis are up, the benchmark is producing
        started = children_of(proc.pid)
        assert started, "the benchmark started no private stack"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        assert code != 0  # interrupted, not finished
        deadline = time.monotonic() + 30
        while any(alive(p) for p in started) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = sorted(p for p in started if alive(p))
        assert not left, f"processes left running after SIGTERM: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in started:  # a failed run must not leave its broker running either
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
