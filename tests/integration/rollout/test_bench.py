"""The proof, small: `streamrank bench rollout` through Kafka with real features, scoring and
outcomes worker processes on a small trained DIN. The bad version (shuffled item rows) is rolled
back, the good one promoted, an identical twin promoted without a false rollback, and each
version's online AUC lands on its offline AUC (the full-size run on ml-100k is in
docs/rollout.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import redis

from streamrank import keys
from tests.conftest import StackInfo

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_bench_rollout_rolls_back_the_bad_promotes_the_good(
    stack: StackInfo, rollout_artifact: Path
) -> None:
    client = redis.Redis.from_url(stack.redis_url)
    before = client.mget([keys.active_model(), keys.model_split()])
    argv = [
        sys.executable, "-m", "workbench.cli", "bench", "rollout", "--artifact",
        str(rollout_artifact), "--steps", "20,50,100", "--hold", "1", "--min-outcomes", "40",
        "--tick", "0.3", "--equal-runs", "1", "--chunk", "150", "--use-stack",
        # a wide AUC margin: the twin must not be rolled back by chance in a test
        "--guard", "auc:0.05,p99:10000ms,degraded:5%", "--json",
    ]  # fmt: skip
    result = subprocess.run(
        argv,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=560,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = orjson.loads(result.stdout)
    bad, good, equal = out["bad"], out["good"], out["equal"]
    assert bad["rolled_back"] and bad["seconds_to_rollback"] > 0
    assert "auc worse" in bad["rollout"]["reason"]
    assert [h["action"] for h in bad["rollout"]["history"]] == ["start", "rollback"]
    assert good["promoted"]
    assert [h["action"] for h in good["rollout"]["history"]] == ["start", "advance", "promote"]
    assert equal["runs"] == 1 and equal["false_rollbacks"] == 0 and equal["promoted"] == 1
    for entry in (good, bad):
        online = entry["online_auc"]
        half = (online["hi"] - online["lo"]) / 2
        assert abs(online["value"] - entry["offline_auc"]) <= 2 * half, entry
    assert bad["offline_auc"] < good["offline_auc"] - 0.15 and good["offline_auc"] > 0.8
    assert out["traffic"]["degraded"] == 0 and out["traffic"]["unanswered"] == 0
    assert client.mget([keys.active_model(), keys.model_split()]) == before
    client.close()
