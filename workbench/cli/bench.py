"""``streamrank bench NAME``: benchmarks that print JSON and measure their baseline in the same
run. Each lives in :mod:`workbench.bench` and exposes ``add_arguments(parser)`` and
``run(args, settings) -> dict``; this module only dispatches (a benchmark is imported when it
runs, so ``streamrank`` starts without torch) and gives every one ``--json`` and ``--out PATH``
(the result also written to a file, which ``streamrank bench report`` draws figures from), and
records the host's load average before and after each run in the result."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from streamrank.settings import Settings
from workbench.cli.common import json_bytes, print_json

logger = logging.getLogger(__name__)


def _streams() -> ModuleType:
    from workbench.bench import streams

    return streams


def _embeddings() -> ModuleType:
    from workbench.bench import embeddings

    return embeddings


def _scoring() -> ModuleType:
    from workbench.bench import scoring

    return scoring


def _cascade() -> ModuleType:
    from workbench.bench import cascade

    return cascade


def _model() -> ModuleType:
    from workbench.bench import model

    return model


def _hotpool() -> ModuleType:
    from workbench.bench import hotpool

    return hotpool


def _rebalance() -> ModuleType:
    from workbench.bench import rebalance

    return rebalance


def _codecs() -> ModuleType:
    from workbench.bench import codecs

    return codecs


def _rollout() -> ModuleType:
    from workbench.bench import rollout

    return rollout


def _loop() -> ModuleType:
    from workbench.bench import loop

    return loop


def _drive() -> ModuleType:
    from workbench.bench import drive

    return drive


def _soak() -> ModuleType:
    from workbench.bench import soak

    return soak


def _profile() -> ModuleType:
    from workbench.bench import profile

    return profile


def _report() -> ModuleType:
    from workbench.bench import report

    return report


BENCHMARKS: dict[str, tuple[Callable[[], ModuleType], str]] = {
    "streams": (_streams, "feature worker throughput and click-to-visible latency"),
    "embeddings": (_embeddings, "embedding store memory, cache hit rates, lookup latency"),
    "scoring": (_scoring, "end-to-end ranking throughput and latency"),
    "cascade": (
        _cascade,
        "retrieval requests through the cascade: max req/s, per-stage p50/p99, result cache",
    ),
    "model": (_model, "DIN forward throughput: straightforward vs serving split"),
    "codecs": (_codecs, "bytes and CPU of each producer compression codec"),
    "hotpool": (_hotpool, "one hot-item pool refresh on a synthetic catalogue: ms, bytes, memory"),
    "rollout": (
        _rollout,
        "staged rollouts on ml-100k decided by online metrics (good, bad, equal)",
    ),
    "loop": (
        _loop,
        "the learning loop on ml-100k in time order: retrained every day vs frozen, new items",
    ),
    "rebalance": (_rebalance, "reply pauses when consumer-group membership changes"),
    "drive": (_drive, "steady clicks and rank requests, every message and reply recorded"),
    "soak": (_soak, "sustained load for M minutes: latency, memory, descriptors, lag per minute"),
    "profile": (_profile, "where a worker's time goes, from a py-spy recording (--format raw)"),
    "report": (_report, "PNG figures into docs/ from the JSON files of the benchmarks (--out)"),
}


def bench_parser(name: str) -> argparse.ArgumentParser:
    """The full argument parser of one benchmark (imports its module)."""
    load, help_text = BENCHMARKS[name]
    parser = argparse.ArgumentParser(prog=f"streamrank bench {name}", description=help_text)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--out",
        type=Path,
        metavar="PATH",
        help="also write the result as JSON to PATH (for `streamrank bench report`)",
    )
    load().add_arguments(parser)
    return parser


def load_average() -> list[float]:
    """The host's 1, 5 and 15 minute load averages: how quiet the machine was for a figure."""
    return [round(v, 2) for v in os.getloadavg()]


def write_result(path: Path, result: dict[str, Any]) -> None:
    """The result as indented JSON at ``path`` (its folder created), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(json_bytes(result) + b"\n")
    tmp.replace(path)
    logger.info("wrote the result to %s", path)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    bench_args = bench_parser(args.bench).parse_args(args.bench_args)
    if bench_args.out is not None:  # a bad path fails now, not after a long run
        bench_args.out.parent.mkdir(parents=True, exist_ok=True)
    before = load_average()
    result = BENCHMARKS[args.bench][0]().run(bench_args, settings)
    result["load_average"] = {"before": before, "after": load_average()}
    if bench_args.json:
        print_json(result)
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    if bench_args.out is not None:
        write_result(bench_args.out, result)
    return 0


def register(sub: Any) -> None:
    bench = sub.add_parser("bench", help="run a benchmark and print its figures")
    names = bench.add_subparsers(dest="bench", metavar="NAME")
    names.required = True
    for name, (_load, help_text) in BENCHMARKS.items():
        # The benchmark's own options are parsed only when it runs, so `streamrank` starts
        # without importing every benchmark (and torch); `bench NAME --help` shows them.
        parser = names.add_parser(name, help=help_text, add_help=False, prefix_chars="\0")
        parser.add_argument("bench_args", nargs=argparse.REMAINDER)
        parser.set_defaults(func=_run)
