"""``--compare-cluster`` of ``bench streams`` and ``bench scoring``: the same benchmark on a single
Redis and on a local Redis Cluster (3 masters, 3 replicas, same binary, same host), in one run.

One private embedded stack in cluster mode gives the broker and the cluster; a private
redis-server next to it is the single Redis. The runs alternate (single, cluster, single, ...)
so a drift of the shared host's load hits both alike; the report has every run, the median of
each figure per kind, and cluster / single ratios of the medians.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from streamrank.settings import Settings

logger = logging.getLogger(__name__)

RunOne = Callable[[Settings, Path], dict[str, Any]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--compare-cluster`` and ``--runs``, shared by the benchmarks that take them."""
    parser.add_argument(
        "--compare-cluster",
        action="store_true",
        help="run on a private single Redis and a private local Redis Cluster, alternating, "
        "and report the cluster / single ratios of the medians",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per kind of Redis (compare)")


def _get(result: dict[str, Any], path: str) -> Any:
    value: Any = result
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def compare_cluster(
    settings: Settings, run_one: RunOne, *, runs: int, figures: Sequence[str]
) -> dict[str, Any]:
    """``run_one(settings, work_dir)`` ``runs`` times on each kind of Redis, alternating; the
    median of each of ``figures`` (dotted paths into a run's result) per kind, and their ratio
    (cluster / standalone)."""
    from workbench.devstack.servers import private_redis
    from workbench.devstack.stack import EmbeddedStack

    with tempfile.TemporaryDirectory(
        prefix="streamrank-bench-compare-", ignore_cleanup_errors=True
    ) as tmp:
        work = Path(tmp)
        stack = EmbeddedStack.on_free_ports(work / "stack", redis_cluster=True)
        stack.up(timeout_s=120)
        try:
            with private_redis(work / "single", persist="none") as single:
                on_cluster = stack.settings_for(settings).with_env(STREAMRANK_RUN_DIR=work / "run")
                on_single = on_cluster.with_env(
                    STREAMRANK_REDIS_URL=SecretStr(single.url), STREAMRANK_REDIS_CLUSTER_NODES=()
                )
                results: dict[str, list[dict[str, Any]]] = {"standalone": [], "cluster": []}
                for n in range(runs):
                    for kind, kind_settings in (("standalone", on_single), ("cluster", on_cluster)):
                        logger.info("run %s of %s on the %s Redis", n + 1, runs, kind)
                        results[kind].append(run_one(kind_settings, work / f"{kind}-{n}"))
        finally:
            stack.down()
    medians = {
        kind: {f: _median([_get(r, f) for r in rs]) for f in figures}
        for kind, rs in results.items()
    }
    ratios = {}
    for f in figures:
        mid_cluster, mid_single = medians["cluster"][f], medians["standalone"][f]
        if mid_cluster is not None and mid_single:
            ratios[f] = round(mid_cluster / mid_single, 3)
    return {
        "runs": runs,
        "cluster": "3 masters + 3 replicas on this host (workbench.devstack.cluster)",
        "median": medians,
        "cluster_vs_standalone": ratios,
        "standalone_runs": results["standalone"],
        "cluster_runs": results["cluster"],
    }


def _median(values: Sequence[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return round(statistics.median(numbers), 3) if numbers else None
