"""``streamrank bench model``: forward-only DIN throughput on each inference runtime.

Every runtime (eager, compiled, onnx: :mod:`scoring.model.runtimes`) scores the same requests
(``--shapes``: candidates x history events, one request per forward unless ``--batch``) with the
same weights; the timed runs rotate between the runtimes so all see the same machine load, and
each ratio is the median of the per-run ratios against eager. The same run checks that every
runtime agrees with eager, times eager with glibc's default allocator first (before the
worker's allocator settings apply: ``STREAMRANK_SCORING_RETAIN_FREED_MB``), and, with
``--straightforward``, the serving split against the straightforward :meth:`DIN.forward`
(which repeats the history per candidate and builds ``[C, L, 4d]`` attention inputs).
``gemm_floor`` times the eager forward's matrix products alone in the same rotation
(:mod:`workbench.bench.gemm_floor`): the most any runtime calling the same kernels could gain.

``--compare-dense``: the serving split with fp32 dense weights against the same weights served
as int8 (dynamic quantisation), timed the same way (alternating runs), and the test AUC of both
on the artifact's ``test_candidates.jsonl`` (the ml-100k test users that ``streamrank train``
evaluates), item rows put through the artifact's published encoding as a worker serves them.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scoring.model.artifact import CANDIDATES_FILE, Artifact, load_artifact
from scoring.model.din import DENSE_WEIGHTS, DIN, ModelSpec
from scoring.model.onnx_graph import export_graph
from scoring.model.runtimes import FORWARD_RUNTIMES, Forward, ForwardRuntime
from scoring.model.scorer import DinScorer, runtime_forward
from scoring.serving.wiring import configure_torch
from streamrank.errors import ConfigError, RuntimeUnavailable
from streamrank.settings import Settings
from workbench.bench.gemm_floor import record_products, replay
from workbench.devstack.cases import load_cases, newest_artifact, offline_scores, quality

GEMM_FLOOR = "gemm_floor"  # the eager forward's matrix products alone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shapes", default="100x50,500x50", help="candidates x history events, comma-separated"
    )
    parser.add_argument(
        "--runtimes", default=",".join(FORWARD_RUNTIMES), help="runtimes to time (eager always)"
    )
    parser.add_argument("--candidates", type=int, default=100, help="candidates (--compare-dense)")
    parser.add_argument("--history", type=int, default=50, help="history events (--compare-dense)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1], help="requests per forward")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per figure (median)")
    parser.add_argument("--seconds", type=float, default=0.5, help="minimum time per timed run")
    parser.add_argument("--artifact", type=Path, default=None, help="use this artifact's weights")
    parser.add_argument(
        "--straightforward",
        action="store_true",
        help="also time the serving split against the straightforward DIN forward",
    )
    parser.add_argument(
        "--compare-dense",
        action="store_true",
        help="time fp32 against int8 dense weights and compare their test AUC (needs a trained "
        "artifact: --artifact, else the newest under STREAMRANK_ARTIFACTS_DIR)",
    )


def _calls_per_run(fn: Any, seconds: float) -> int:
    """How many calls make one timed run last about ``seconds``."""
    fn()  # warm up
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds / 4:
            return max(1, int(calls * seconds / elapsed))
        calls *= 2


def _per_call(fn: Any, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _time_rotating(
    fns: Mapping[str, Any], *, seconds: float, repeats: int
) -> dict[str, list[float]]:
    """Seconds per call of each function in each of ``repeats`` runs; the runs rotate
    (a, b, c, a, b, c, ...) so all see the same load on a shared machine."""
    calls = {name: _calls_per_run(fn, seconds) for name, fn in fns.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_per_call(fn, calls[name]))
    return times


def _time_pair(a: Any, b: Any, *, seconds: float, repeats: int) -> tuple[float, float, float]:
    """Median seconds per call of ``a`` and ``b`` and the median of the per-run ratios a/b."""
    times = _time_rotating({"a": a, "b": b}, seconds=seconds, repeats=repeats)
    ratios = [x / y for x, y in zip(times["a"], times["b"], strict=True)]
    return statistics.median(times["a"]), statistics.median(times["b"]), statistics.median(ratios)


def _plain(net: DIN, hist: torch.Tensor, mask: torch.Tensor, cands: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        result: torch.Tensor = net(hist, mask, cands)
        return result


def _test_auc(artifact: Artifact) -> dict[str, Any]:
    """Test AUC/GAUC of fp32 and int8 dense weights on the artifact's test users."""
    cases = load_cases(artifact.path / CANDIDATES_FILE)
    labels = np.array([c.labels for c in cases], dtype=np.float32)  # [U, C]
    max_history = int(artifact.config.get("train", {}).get("history_len", 50))
    scores = {
        dense: offline_scores(
            artifact, cases, encoding=artifact.encoding, max_history=max_history, dense=dense
        )
        for dense in DENSE_WEIGHTS
    }
    out: dict[str, Any] = {
        "users": len(cases),
        "encoding": artifact.encoding,
        **{dense: quality(labels, s) for dense, s in scores.items()},
        "max_abs_score_diff": float(np.abs(scores["int8"] - scores["fp32"]).max()),
    }
    out["auc_drop"] = round(out["fp32"]["auc"] - out["int8"]["auc"], 6)
    return out


def compare_dense(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """fp32 against int8 dense weights: forward time (same requests, alternating runs) and AUC."""
    torch.set_num_threads(settings.scoring.torch_threads)
    ref = (
        args.artifact
        if args.artifact is not None
        else newest_artifact(settings.tools.artifacts_dir)
    )
    artifact = load_artifact(ref)
    fp32, int8 = artifact.scorer(dense="fp32"), artifact.scorer(dense="int8")
    c, length = args.candidates, args.history
    out: dict[str, Any] = {
        "artifact": artifact.version,
        "candidates": c,
        "history": length,
        "torch_threads": settings.scoring.torch_threads,
        "repeats": args.repeats,
        "results": [],
    }
    gen = torch.Generator().manual_seed(1)
    rows = torch.from_numpy(artifact.item_table)  # [N, d]: real item vectors
    for b in args.batch:
        hist = rows[torch.randint(len(rows), (b, length), generator=gen)]  # [B, L, d]
        cands = rows[torch.randint(len(rows), (b, c), generator=gen)]  # [B, C, d]
        mask = torch.ones(b, length, dtype=torch.bool)  # [B, L]
        cmask = torch.ones(b, c, dtype=torch.bool)  # [B, C]
        run_fp32 = functools.partial(fp32.score_logits, hist, mask, cands, cmask)
        run_int8 = functools.partial(int8.score_logits, hist, mask, cands, cmask)
        diff = float((torch.sigmoid(run_fp32()) - torch.sigmoid(run_int8())).abs().max())
        t_fp32, t_int8, ratio = _time_pair(
            run_fp32, run_int8, seconds=args.seconds, repeats=args.repeats
        )
        out["results"].append(
            {
                "batch_requests": b,
                "fp32_ms": round(t_fp32 * 1e3, 3),
                "int8_ms": round(t_int8 * 1e3, 3),
                "fp32_requests_per_s": round(b / t_fp32),
                "int8_requests_per_s": round(b / t_int8),
                "int8_speedup": round(ratio, 2),  # median of per-run fp32/int8 ratios
                "max_abs_prob_diff": diff,
            }
        )
    out["test"] = _test_auc(artifact)
    faster = all(r["int8_speedup"] > 1.0 for r in out["results"])
    out["int8_keeps"] = bool(faster and out["test"]["auc_drop"] <= 0.002)
    return out


def _shapes(text: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(n) for n in part.split("x")) for part in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise ConfigError(f"--shapes {text!r}: use CANDIDATESxHISTORY[,...], e.g. 100x50,500x50")
    return [(p[0], p[1]) for p in pairs]


def _runtimes(text: str) -> list[ForwardRuntime]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FORWARD_RUNTIMES]
    if unknown:
        raise ConfigError(f"--runtimes: unknown {unknown}; use {', '.join(FORWARD_RUNTIMES)}")
    return ["eager", *(n for n in FORWARD_RUNTIMES if n in names and n != "eager")]


def _forwards(
    scorer: DinScorer, runtimes: list[ForwardRuntime], threads: int
) -> tuple[dict[str, Forward], dict[str, Any]]:
    """Each runtime's forward of ``scorer``'s weights, and what setting it up cost."""
    out: dict[str, Forward] = {}
    setup: dict[str, Any] = {}
    for name in runtimes:
        start = time.perf_counter()
        try:
            graph = export_graph(scorer.pair) if name == "onnx" else None
            out[name] = runtime_forward(scorer.pair, name, graph=graph, threads=threads)
        except RuntimeUnavailable as exc:
            setup[name] = {"unavailable": str(exc)}
            continue
        setup[name] = {"setup_s": round(time.perf_counter() - start, 2)}
    return out, setup


def _shape_inputs(
    scorer: DinScorer, b: int, c: int, length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    d = scorer.spec.item_dim
    with torch.inference_mode():  # what serving passes (score_logits runs in inference mode)
        hist = torch.randn(b, length, d, generator=gen)  # [B, L, d]
        mask = torch.ones(b, length, dtype=torch.bool)  # [B, L]
        cands = torch.randn(b, c, d, generator=gen)  # [B, C, d]
    return hist, mask, cands


def _time_shape(
    forwards: Mapping[str, Forward],
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    b: int,
    args: Any,
) -> dict[str, Any]:
    """Every runtime on one shape (req/s, ms per forward, ratio to eager, largest difference),
    and under ``GEMM_FLOOR`` the eager forward's matrix products alone, timed in the same
    rotation."""
    hist, mask, cands = inputs
    calls = {
        name: functools.partial(f, hist, mask, cands, None, None) for name, f in forwards.items()
    }
    products = record_products(calls["eager"])
    with torch.inference_mode():
        want = torch.sigmoid(calls["eager"]())
        diffs = {n: float((torch.sigmoid(fn()) - want).abs().max()) for n, fn in calls.items()}
        times = _time_rotating(
            {**calls, GEMM_FLOOR: replay(products)}, seconds=args.seconds, repeats=args.repeats
        )
    out: dict[str, Any] = {}
    for name, runs in times.items():
        ratios = [e / t for e, t in zip(times["eager"], runs, strict=True)]
        out[name] = {
            "forward_rps": round(b / statistics.median(runs), 1),
            "forward_ms": round(statistics.median(runs) * 1e3, 4),
            "vs_eager": round(statistics.median(ratios), 3),  # median of per-run eager/this
        }
        if name in diffs:
            out[name]["max_abs_prob_diff"] = diffs[name]
    flops = sum(call.flops for call in products)
    out[GEMM_FLOOR] |= {
        "products": len(products),
        "mflop_per_forward": round(flops / 1e6, 3),
        "gflop_per_s": round(flops / statistics.median(times[GEMM_FLOOR]) / 1e9, 1),
    }
    return out


def _eager_default_allocator(scorer: DinScorer, shapes: list[tuple[int, int]], args: Any) -> Any:
    """Eager req/s per shape before the allocator settings apply (glibc's own thresholds)."""
    out = {}
    for c, length in shapes:
        inputs = _shape_inputs(scorer, 1, c, length)
        fn = functools.partial(scorer.pair, *inputs)
        with torch.inference_mode():
            runs = _time_rotating({"eager": fn}, seconds=args.seconds, repeats=args.repeats)
        out[f"{c}x{length}"] = {"forward_rps": round(1 / statistics.median(runs["eager"]), 1)}
    return out


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    if args.compare_dense:
        return compare_dense(args, settings)
    shapes, runtimes = _shapes(args.shapes), _runtimes(args.runtimes)
    torch.set_num_threads(settings.scoring.torch_threads)
    if args.artifact is not None:
        scorer = load_artifact(args.artifact).scorer()
    else:
        torch.manual_seed(0)
        scorer = DinScorer(DIN(ModelSpec()))
    default_allocator = _eager_default_allocator(scorer, shapes, args)
    configure_torch(settings.scoring)  # threads and allocator as a scoring worker has them
    forwards, setup = _forwards(scorer, runtimes, settings.scoring.torch_threads)
    out: dict[str, Any] = {
        "shapes": [f"{c}x{length}" for c, length in shapes],
        "item_dim": scorer.spec.item_dim,
        "attention_hidden": list(scorer.spec.attention_hidden),
        "torch_threads": settings.scoring.torch_threads,
        "repeats": args.repeats,
        "default_runtime": settings.scoring.runtime,
        "retain_freed_mb": settings.scoring.retain_freed_mb,
        "eager_default_allocator": default_allocator,
        "runtimes": {name: {**setup[name], "shapes": {}} for name in runtimes},
        GEMM_FLOOR: {"shapes": {}},
    }
    for b in args.batch:
        for c, length in shapes:
            timed = _time_shape(forwards, _shape_inputs(scorer, b, c, length), b, args)
            for name, figures in timed.items():
                entry = out[GEMM_FLOOR] if name == GEMM_FLOOR else out["runtimes"][name]
                entry["shapes"][f"{b}x{c}x{length}"] = figures
    first = f"{args.batch[0]}x{shapes[0][0]}x{shapes[0][1]}"
    out[GEMM_FLOOR]["vs_eager"] = out[GEMM_FLOOR]["shapes"][first]["vs_eager"]
    for name, entry in out["runtimes"].items():
        if name in forwards:  # the headline: the first batch size and shape
            entry["forward_rps"] = entry["shapes"][first]["forward_rps"]
            entry["vs_eager"] = entry["shapes"][first]["vs_eager"]
    timed_rps = {n: e["forward_rps"] for n, e in out["runtimes"].items() if "forward_rps" in e}
    out["fastest_runtime"] = max(timed_rps, key=lambda n: timed_rps[n])
    if args.straightforward:
        out["straightforward"] = _straightforward(scorer, args)
    return out


def _straightforward(scorer: DinScorer, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The serving split (eager) against :meth:`DIN.forward` on the first shape."""
    c, length = _shapes(args.shapes)[0]
    rows = []
    for b in args.batch:
        hist, mask, cands = _shape_inputs(scorer, b, c, length)
        flat_hist = hist.repeat_interleave(c, 0)  # [B*C, L, d]
        flat_mask = mask.repeat_interleave(c, 0)  # [B*C, L]
        flat_cands = cands.reshape(b * c, -1)  # [B*C, d]
        plain = functools.partial(_plain, scorer.net, flat_hist, flat_mask, flat_cands)
        cmask = torch.ones(b, c, dtype=torch.bool)  # [B, C]
        split = functools.partial(scorer.score_logits, hist, mask, cands, cmask)
        diff = float((plain().view(b, c) - split()).abs().max())
        t_plain, t_split, ratio = _time_pair(
            plain, split, seconds=args.seconds, repeats=args.repeats
        )
        rows.append(
            {
                "batch_requests": b,
                "straightforward_ms": round(t_plain * 1e3, 3),
                "split_ms": round(t_split * 1e3, 3),
                "speedup": round(ratio, 2),  # median of per-run ratios (runs alternate)
                "max_abs_logit_diff": diff,
            }
        )
    return rows
