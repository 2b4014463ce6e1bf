"""``streamrank bench model``: forward-only DIN throughput, straightforward vs the serving split.

Both paths score the same requests (``--candidates`` items against one ``--history`` of events)
with the same weights: the straightforward :meth:`DIN.forward` repeats the history per
candidate and builds ``[C, L, 4d]`` attention inputs; :class:`DinScorer` splits the first
attention layer (candidate term, history term once per request, product term). The figures are
medians over ``--repeats`` timed runs, alternating between the two paths so both see the same
machine load; the speed-up is the median of the per-run ratios. The same run checks that the
two paths agree.

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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scoring.model.artifact import CANDIDATES_FILE, Artifact, load_artifact
from scoring.model.din import DENSE_WEIGHTS, DIN, DinScorer, ModelSpec
from streamrank.settings import Settings
from workbench.devstack.cases import load_cases, newest_artifact, offline_scores, quality


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--candidates", type=int, default=100, help="candidates per request")
    parser.add_argument("--history", type=int, default=50, help="history events per request")
    parser.add_argument(
        "--batch", type=int, nargs="+", default=[1, 32], help="requests per forward"
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per figure (median)")
    parser.add_argument("--seconds", type=float, default=0.5, help="minimum time per timed run")
    parser.add_argument("--artifact", type=Path, default=None, help="use this artifact's weights")
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


def _time_pair(a: Any, b: Any, *, seconds: float, repeats: int) -> tuple[float, float, float]:
    """Median seconds per call of ``a`` and ``b`` and the median of the per-run ratios a/b.

    Runs alternate (a, b, a, b, ...) so both paths see the same load on a shared machine.
    """
    calls_a, calls_b = _calls_per_run(a, seconds), _calls_per_run(b, seconds)
    times_a, times_b = [], []
    for _ in range(repeats):
        times_a.append(_per_call(a, calls_a))
        times_b.append(_per_call(b, calls_b))
    ratios = [x / y for x, y in zip(times_a, times_b, strict=True)]
    return statistics.median(times_a), statistics.median(times_b), statistics.median(ratios)


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


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    if args.compare_dense:
        return compare_dense(args, settings)
    torch.set_num_threads(settings.scoring.torch_threads)
    if args.artifact is not None:
        scorer = load_artifact(args.artifact).scorer()
    else:
        torch.manual_seed(0)
        scorer = DinScorer(DIN(ModelSpec()))
    net = scorer.net
    d, c, length = scorer.spec.item_dim, args.candidates, args.history
    out: dict[str, Any] = {
        "candidates": c,
        "history": length,
        "item_dim": d,
        "attention_hidden": list(scorer.spec.attention_hidden),
        "torch_threads": settings.scoring.torch_threads,
        "repeats": args.repeats,
        "results": [],
    }
    gen = torch.Generator().manual_seed(1)
    for b in args.batch:
        hist = torch.randn(b, length, d, generator=gen)  # [B, L, d]
        mask = torch.ones(b, length, dtype=torch.bool)  # [B, L]
        cands = torch.randn(b, c, d, generator=gen)  # [B, C, d]
        flat_hist = hist.repeat_interleave(c, 0)  # [B*C, L, d]
        flat_mask = mask.repeat_interleave(c, 0)  # [B*C, L]
        flat_cands = cands.reshape(b * c, d)  # [B*C, d]

        straightforward = functools.partial(_plain, net, flat_hist, flat_mask, flat_cands)
        cmask = torch.ones(b, c, dtype=torch.bool)  # [B, C]
        split = functools.partial(scorer.score_logits, hist, mask, cands, cmask)

        diff = float((straightforward().view(b, c) - split()).abs().max())
        t_plain, t_split, ratio = _time_pair(
            straightforward, split, seconds=args.seconds, repeats=args.repeats
        )
        out["results"].append(
            {
                "batch_requests": b,
                "straightforward_ms": round(t_plain * 1e3, 3),
                "split_ms": round(t_split * 1e3, 3),
                "straightforward_candidates_per_s": round(b * c / t_plain),
                "split_candidates_per_s": round(b * c / t_split),
                "speedup": round(ratio, 2),  # median of per-run ratios (runs alternate)
                "max_abs_logit_diff": diff,
            }
        )
    out["speedup_median"] = float(np.median([r["speedup"] for r in out["results"]]))
    return out
