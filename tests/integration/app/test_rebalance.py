"""Scaling consumer groups under load (`streamrank bench rebalance` at a small scale): scoring
workers 1 -> 2 -> 3 -> 2 and a restart, with dynamic and with static membership; features
workers 1 -> 2. Every request is answered, the partitions are spread over the members after
each change, a static member gets its partitions back after a restart, and no click is lost
or counted twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import StackInfo
from workbench.bench import rebalance
from workbench.cli.bench import bench_parser

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
PARTITIONS = 6


def test_groups_scale_under_load_without_losing_anything(stack: StackInfo, tmp_path: Path) -> None:
    args = bench_parser("rebalance").parse_args(
        [
            "--phase-s",
            "10",
            "--rate",
            "20",
            "--click-rate",
            "200",
            "--partitions",
            str(PARTITIONS),
            "--logs",
            str(tmp_path),
        ]
    )
    result = rebalance.run(args, stack.settings())
    modes = {run["membership"]: run for run in result["scoring"]}
    assert set(modes) == {"dynamic", "static"}
    for mode, run in modes.items():
        assert run["sent"] > 0 and run["answered"] == run["sent"], (mode, run)
        assert list(run["changes"]) == ["join: 1 -> 2", "join: 2 -> 3", "leave: 3 -> 2",
                                        "restart: one of 2"]  # fmt: skip
        for what, change in run["changes"].items():
            assert change["answered"] == change["sent"] > 0, (mode, what, change)
            assert change["p99_ms"] is not None and change["max_ms"] >= change["p99_ms"]
            layout = change["partitions"]
            owned = sorted(p for ps in layout.values() for p in ps)
            assert owned == list(range(PARTITIONS)), (mode, what, layout)
            sizes = [len(ps) for ps in layout.values()]
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1, (mode, what, layout)
    # static membership: the restarted member comes back under its id with its partitions,
    # and nobody else's assignment moved
    static = modes["static"]["changes"]
    assert static["restart: one of 2"]["partitions"] == static["leave: 3 -> 2"]["partitions"]
    assert all(m.startswith("rebalance-static-") for m in static["join: 2 -> 3"]["partitions"])

    features = result["features"]
    assert features["sent"] > features["sent_before_join"] > 0
    assert features["in_sequences"] == features["sent"], features  # none lost, none twice
    assert features["counted_1h"] == features["sent"], features
    assert len(features["partitions"]) == 2
