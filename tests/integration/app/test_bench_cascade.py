"""`streamrank bench cascade --quick` runs end to end on its own private stack and reports every
figure it promises (no timing is asserted: the shared host decides those)."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest


@pytest.mark.slow
def test_bench_cascade_quick() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "bench", "cascade", "--quick", "--json"],
        env=dict(os.environ), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = orjson.loads(result.stdout)
    setup = out["setup"]
    assert setup["index"]["kind"] == "flat" and setup["index"]["rows"] == 20_000
    assert setup["redis_model_bytes"] > 0 and setup["hot_pool"]["incremental"]["held_mb"] > 0
    assert out["in_process"]["stages_ms"]["search"]["p99_ms"] > 0
    miss = out["miss"]
    assert miss["max_rps"] > 0 and miss["saturation"]["answered"] == 300
    assert set(miss["latency"]) == {"0.25x", "0.5x", "0.75x"}
    for figures in miss["latency"].values():
        assert figures["answered"] == figures["sent"] > 0 and "total" in figures["stages"]
    for mode in ("local", "redis"):
        hit = out["cache"][mode]["hit"]
        assert hit["answered"] == hit["sent"] and hit["cached_share"] > 0.5, hit
        assert hit["hit_worker_ms"]["p50_ms"] > 0
    assert len(out["goals"]) == 3 and all(isinstance(v, bool) for v in out["goals"].values())
    assert len(out["load_average"]["before"]) == len(out["load_average"]["after"]) == 3
