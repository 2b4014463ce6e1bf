"""``streamrank bench NAME``: benchmarks that print JSON and measure their baseline in the same run.

Each benchmark lives beside the code it measures and exposes ``add_arguments(parser)`` and
``run(args, settings) -> dict``; this module only dispatches.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from typing import Any

from streamrank.settings import Settings

BENCHMARKS: dict[str, tuple[str, str]] = {
    "streams": ("streams.bench", "feature worker throughput and click-to-visible latency"),
    "embeddings": (
        "scoring.bench_embeddings",
        "embedding store memory, cache hit rates, lookup latency",
    ),
    "scoring": ("scoring.bench_scoring", "end-to-end ranking throughput and latency"),
    "model": ("scoring.bench_model", "DIN forward throughput: straightforward vs serving split"),
    "codecs": ("streamrank.bench_codecs", "bytes and CPU of each producer compression codec"),
}


def bench_parser(name: str) -> argparse.ArgumentParser:
    """The full argument parser of one benchmark (imports its module)."""
    module_name, help_text = BENCHMARKS[name]
    parser = argparse.ArgumentParser(prog=f"streamrank bench {name}", description=help_text)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    importlib.import_module(module_name).add_arguments(parser)
    return parser


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from streamrank.cli import print_json

    bench_args = bench_parser(args.bench).parse_args(args.bench_args)
    module = importlib.import_module(BENCHMARKS[args.bench][0])
    result = module.run(bench_args, settings)
    if bench_args.json:
        print_json(result)
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


def register(sub: Any) -> None:
    bench = sub.add_parser("bench", help="run a benchmark and print its figures")
    names = bench.add_subparsers(dest="bench", metavar="NAME")
    names.required = True
    for name, (module_name, help_text) in BENCHMARKS.items():
        if importlib.util.find_spec(module_name) is None:
            continue
        # The benchmark's own options are parsed only when it runs, so `streamrank` starts
        # without importing every benchmark (and torch); `bench NAME --help` shows them.
        parser = names.add_parser(name, help=help_text, add_help=False, prefix_chars="\0")
        parser.add_argument("bench_args", nargs=argparse.REMAINDER)
        parser.set_defaults(func=_run)
