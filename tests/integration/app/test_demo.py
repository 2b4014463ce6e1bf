"""`streamrank demo` as `make demo` runs it: it starts its own stack, trains a small model, runs
both workers, prints a user's sequence filling up and ranked replies, and Ctrl-C stops
everything it started (workers first, then the stack)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from workbench.devstack.services import free_port, port_in_use

pytestmark = pytest.mark.timeout(240)

FEATURES = re.compile(r"^features: user (\S+) has (\d+) events in its sequence")
RANK = re.compile(r"^rank: user (\S+) -> model (\S+), degraded=(True|False)")
TOP = re.compile(r"^  1\. (0\.\d{4})  (\S+)")
PID = re.compile(r"^demo: (features|scoring) worker pid (\d+) ready")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def demo_env(tmp_path: Path, kafka_port: int, redis_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")}
    env.update(
        STREAMRANK_RUN_DIR=str(tmp_path / "run"),
        STREAMRANK_STACK_KAFKA_PORT=str(kafka_port),
        STREAMRANK_STACK_REDIS_PORT=str(redis_port),
        STREAMRANK_DATA_DIR=str(tmp_path / "no-data"),  # -> the synthetic model (seconds)
        STREAMRANK_DATA_CACHE_DIR=str(tmp_path / "no-data"),  # even after a `data fetch`
        STREAMRANK_ARTIFACTS_DIR=str(tmp_path / "artifacts"),
        STREAMRANK_SCORING_BUDGET_MS="5000",  # a loaded CI host must not turn replies degraded
        PYTHONUNBUFFERED="1",
        COLUMNS="160",
    )
    return env


def test_demo_shows_the_pipeline_and_ctrl_c_stops_everything_it_started(tmp_path: Path) -> None:
    kafka_port, redis_port = free_port(), free_port()
    env = demo_env(tmp_path, kafka_port, redis_port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "demo", "--view", "user", "--every", "1",
         "--no-progress"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    lengths: list[int] = []
    ranked: list[tuple[str, str]] = []
    pids: dict[str, int] = {}
    # training and the workers' start take most of a loaded CI host's time; the watch itself
    # gets a fixed window from the moment clicks start flowing
    deadline = time.monotonic() + 130
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("demo: producing"):
                deadline = time.monotonic() + 45
            if m := PID.match(line):
                pids[m[1]] = int(m[2])
            if m := FEATURES.match(line):
                lengths.append(int(m[2]))
            if (m := RANK.match(line)) and m[3] == "False":
                ranked.append((m[1], m[2]))
            if len(set(lengths) - {0}) >= 2 and ranked and TOP.match(line):
                break
        text = "".join(lines)
        assert "demo: model: training DIN on synthetic" in text, text
        assert re.search(r"demo: model din-\S+: published \(int8 item table", text), text
        assert set(pids) == {"features", "scoring"}, text
        # the watched user's sequence fills up as clicks flow through the features worker
        grown = [n for n in lengths if n > 0]
        assert len(set(grown)) >= 2 and grown == sorted(grown), text
        # ranked replies from the published model, not degraded, with a top item and its score
        version = re.search(r"demo: model (din-\S+):", text)
        assert version and ranked and ranked[-1][1] == version[1], text
        assert TOP.match(lines[-1]), text
        assert port_in_use(kafka_port) and port_in_use(redis_port)
        assert all(_alive(pid) for pid in pids.values())
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(lines) + out
    assert "demo: stopped the scoring and features workers (exit codes 0, 0)" in out, out
    assert "demo: stopped kafka, redis" in out
    assert out.index("stopped the scoring") < out.index("stopped kafka, redis")
    assert not port_in_use(kafka_port) and not port_in_use(redis_port)
    assert not any(_alive(pid) for pid in pids.values())


DASHBOARD_REQUESTS = re.compile(r"rank requests\W+([\d,]+\.\d)\W+([\d,]+\.\d) ms\W+([\d,]+\.\d) ms")
DASHBOARD_CLICKS = re.compile(r"clicks applied\W+([\d,]+\.\d)")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_shows_the_dashboard_and_tail_follows_its_results_live(tmp_path: Path) -> None:
    kafka_port, redis_port = free_port(), free_port()
    env = demo_env(tmp_path, kafka_port, redis_port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "demo", "--every", "2", "--no-progress"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    requests = clicks = 0.0
    tail: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not (requests > 0 and clicks > 0):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if m := DASHBOARD_REQUESTS.search(line):
                requests = float(m[1].replace(",", ""))
            if m := DASHBOARD_CLICKS.search(line):
                clicks = float(m[1].replace(",", ""))
        text = "".join(lines)
        assert requests > 0 and clicks > 0, text
        assert "streamrank demo: features workers up 1/1, scoring workers up 1/1" in text, text
        assert "consumer lag" in text and "din-" in text
        assert "streamrank tail rank-results --follow" in text
        # an analyst follows the results while the demo runs
        tail = subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", "tail", "rank-results", "--follow",
             "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert tail.stdout is not None
        first = [orjson.loads(tail.stdout.readline()) for _ in range(30)]
        assert all(m["topic"] == "rank-results" and m["value"]["request_id"] for m in first)
        assert len({m["value"]["user_id"] for m in first}) > 5  # many users, not one
    finally:
        if tail is not None:
            tail.send_signal(signal.SIGINT)
            _, err = tail.communicate(timeout=30)
            assert tail.returncode == 0 and "messages read from rank-results" in err, err
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "demo: stopped the scoring and features workers (exit codes 0, 0)" in out, out
    assert not port_in_use(kafka_port) and not port_in_use(redis_port)
