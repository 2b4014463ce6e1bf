"""``streamrank bench profile``: where a worker's time goes, from a py-spy recording.

    py-spy record --pid PID --rate 200 --native --format raw -o worker.raw
    streamrank bench profile worker.raw --json

Each sample's stack is put in one class (the first rule that matches, innermost frame first):

* ``model_forward``: under ``DinScorer`` (torch's compute, called from our model code);
* ``ours``: the innermost Python frame is in one of our packages (``--ours``);
* ``library:<name>``: it is in a library (``redis``, ``aiokafka``, ``faust``, ``asyncio`` for
  the event loop and its epoll wait, ``python`` for the rest of the standard library), named by
  its top-level module; native frames count for the Python frame that called them;
* ``startup``: module imports (the worker starting, not serving).

The JSON gives each class's share of the samples (startup excluded from ``steady_share``),
the top frames of ours, and the inputs. Pure parsing (:func:`summarise`), no I/O but the file.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from streamrank.settings import Settings

OUR_PACKAGES = ("scoring", "streams", "schemas", "streamrank")
MODEL_FRAMES = ("DinScorer.", "PairForward.")
STARTUP_FRAMES = ("_find_and_load", "_call_with_frames_removed")
EVENT_LOOP = frozenset({"asyncio", "selectors"})  # the loop and its epoll wait
MINOR = 0.005  # classes below this share are summed as "other"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("raw", type=Path, help="py-spy record --format raw output")
    parser.add_argument("--ours", default=",".join(OUR_PACKAGES), help="our top-level packages")
    parser.add_argument("--top", type=int, default=15, help="how many of our frames to list")


def _frame_file(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``path/to/file.py`` ('' for a native frame)."""
    if not frame.endswith(")") or " (" not in frame:
        return ""
    where = frame.rsplit(" (", 1)[1][:-1]
    path = where.rsplit(":", 1)[0]
    return path if path.endswith(".py") or path.startswith("<") else ""


def _package(path: str) -> str:
    """The top-level module of a frame's file: ``redis/asyncio/client.py`` -> ``redis``."""
    if path.startswith("<"):
        return "python"
    parts = Path(path).parts
    if "site-packages" in parts:
        parts = parts[parts.index("site-packages") + 1 :]
    elif "lib" in parts and any(p.startswith("python3") for p in parts):
        return "python"  # the standard library
    name = parts[0].removesuffix(".py") if parts else "unknown"
    if name in EVENT_LOOP:
        return "asyncio"
    return "python" if name in sys.stdlib_module_names else name


def classify(frames: Sequence[str], ours: Sequence[str]) -> str:
    """The class of one sample (its frames outermost first)."""
    names = [f.split(" (", 1)[0] for f in frames]
    if any(n in STARTUP_FRAMES for n in names):
        return "startup"
    if any(n.startswith(MODEL_FRAMES) for n in names):
        return "model_forward"
    for frame in reversed(frames):  # the innermost Python frame decides
        path = _frame_file(frame)
        if not path:
            continue
        package = _package(path)
        if package in ours:
            return "ours"
        return f"library:{package}"
    return "native"


def summarise(lines: Iterable[str], *, ours: Sequence[str], top: int = 15) -> dict[str, Any]:
    """Shares of the samples per class, from py-spy's raw (collapsed-stack) lines."""
    classes: collections.Counter[str] = collections.Counter()
    our_frames: collections.Counter[str] = collections.Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        kind = classify(frames, ours)
        classes[kind] += n
        total += n
        if kind == "ours":
            innermost = next(f for f in reversed(frames) if _frame_file(f))
            our_frames[innermost.split(" (", 1)[0]] += n
    steady = total - classes["startup"]
    serving = classes.copy()
    del serving["startup"]
    tops = our_frames.most_common(top)
    return {
        "samples": total,
        "share": _shares(classes, total),
        "steady_share": _shares(serving, steady),
        "top_ours_steady_share": {k: round(v / steady, 4) for k, v in tops} if steady else {},
    }


def _shares(counts: collections.Counter[str], total: int) -> dict[str, float]:
    """Each class's share, largest first; the minor ones summed as ``other``."""
    if not total:
        return {}
    out: dict[str, float] = {}
    other = 0
    for kind, n in counts.most_common():
        if n / total >= MINOR:
            out[kind] = round(n / total, 4)
        else:
            other += n
    if other:
        out["other"] = round(other / total, 4)
    return out


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    ours = tuple(p.strip() for p in args.ours.split(",") if p.strip())
    with args.raw.open(encoding="utf-8", errors="replace") as lines:
        result = summarise(lines, ours=ours, top=args.top)
    if not result["samples"]:
        raise SystemExit(f"{args.raw} holds no samples: record one with py-spy --format raw")
    result["input"] = str(args.raw)
    return result
