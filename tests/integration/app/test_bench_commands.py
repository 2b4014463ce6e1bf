"""`streamrank bench streams` and `bench scoring` run end to end on a small scale and report
every figure they promise (the figures themselves are measured by the full-size commands and
kept in docs/benchmarks.md; no timing is asserted here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.conftest import StackInfo


def bench(*args: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "bench", *args, "--json"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parsed: dict[str, object] = orjson.loads(result.stdout)
    return parsed


# Its Redis figures are summed over every master and its cleanup scans every master.
@pytest.mark.cluster
def test_bench_streams_small(stack: StackInfo, tmp_path: Path) -> None:
    saved = tmp_path / "results" / "streams.json"
    out = bench("streams", "--events", "40000", "--users", "300", "--rate", "1000",
                "--latency-seconds", "2", "--out", str(saved))  # fmt: skip
    # 40,000 events: enough for the drain to span several of its 0.1 s polls
    assert out["events"] == 40000 and out["private_stack"] is False
    for key in ("events_per_s", "raw_consume_per_s", "latency_p50_ms", "latency_p99_ms"):
        assert isinstance(out[key], float) and out[key] > 0, key
    assert out["latency_probes"] == 2 * 1000 // 25
    # the Redis side of the drain: the script calls and, counted by Redis, the commands they ran
    for key in ("redis_cpu_us_per_event", "redis_script_us_per_event"):
        assert isinstance(out[key], float) and out[key] > 0, key
    inside = out["redis_commands_us_per_event"]
    # (the default id_sets contract: the id set's lookups and adds instead of per-event SETs)
    assert isinstance(inside, dict) and {"smismember", "sadd", "zadd", "hincrby"} <= set(inside)
    assert "set" not in inside, inside
    share = out["redis_script_interpreter_share"]
    assert isinstance(share, float) and 0 < share < 1
    busy = out["host_busy_cores"]
    assert isinstance(busy, float) and 0 < busy <= (os.cpu_count() or 1) + 0.05
    # --out: the same result in a file, which `bench report` draws from
    assert orjson.loads(saved.read_bytes()) == out
    drawn = bench("report", "--streams", str(saved), "--docs", str(tmp_path / "docs"))
    figure = Path(drawn["figures"]["streams_throughput"])  # type: ignore[index]
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 15_000


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_bench_scoring_quick(stack: StackInfo, workers: int) -> None:
    out = bench(
        "scoring", "--quick", "--rates", "50", "--modes", "per_request", "--workers", str(workers),
        "--runtime-ab",
    )  # fmt: skip
    assert out["config"]["stack"] == "configured"  # type: ignore[index]
    assert out["config"]["workers"] == workers  # type: ignore[index]
    for key in ("max_rps", "naive_max_rps", "forward_only_rps"):
        assert isinstance(out[key], float) and out[key] > 0, key
    latency = out["latency"]["50"]  # type: ignore[index]
    assert latency["answered"] == latency["sent"] and latency["degraded"] == 0
    echo = out["echo"]  # type: ignore[index]
    assert (
        echo["max_rps"] > 0 and echo["latency"]["50"]["answered"] == echo["latency"]["50"]["sent"]
    )
    assert out["overhead_p99_ms"]["50"] == round(  # type: ignore[index]
        latency["p99_ms"] - echo["latency"]["50"]["p99_ms"], 2
    )
    assert 0 < latency["loadgen_cpu_percent"] < 100 * (os.cpu_count() or 1)
    busy = out["saturation_host_busy_cores"]["per_request"]  # type: ignore[index]
    assert 0 < busy <= (os.cpu_count() or 1) + 0.05
    # the true floor (a minimal aiokafka echo) at the same rates, half of max_rps among them
    half = out["half_max_rps_rate"]
    assert half == min(1000, round(out["max_rps_by_forward"]["per_request"] / 2))  # type: ignore[index]
    floor = out["floor"]  # type: ignore[index]
    assert set(floor["latency"]) == set(out["latency"]) == {"50", f"{half}"}  # type: ignore[arg-type]
    assert floor["max_rps"] > 0 and floor["latency"]["50"]["answered"] > 0
    assert out["overhead_vs_floor_p99_ms"][f"{half}"] == round(  # type: ignore[index]
        out["latency"][f"{half}"]["p99_ms"] - floor["latency"][f"{half}"]["p99_ms"],
        2,  # type: ignore[index]
    )
    # the A/B against the scorer before the inference runtimes, same mode, same run
    ab = out["runtime_ab"]  # type: ignore[index]
    assert ab["previous"]["STREAMRANK_SCORING_RUNTIME"] == "eager"
    assert ab["current"]["runtime"] == "compiled" and ab["previous"]["max_rps"] > 0
    assert ab["max_rps_vs_previous"] == round(
        ab["current"]["max_rps"] / ab["previous"]["max_rps"], 3
    )
    assert out["forward_only_runtime"] == "compiled"
    assert set(out["goals"]) == {  # type: ignore[arg-type]
        "max_rps >= 1000",
        "max_rps >= 65% of forward-only",
        "p99 <= 25 ms at 200 req/s",
        "p99 - echo p99 <= 10 ms at 200 req/s",
        "max_rps >= 3x naive",
        "max_rps >= 60% of forward-only",
        "p99 - floor p99 <= 15 ms at half max_rps",
        "max_rps >= 1.6x the previous scorer",
    }
