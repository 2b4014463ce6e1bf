"""``streamrank bench model``: forward-only DIN throughput, straightforward vs the serving split.

Both paths score the same requests (``--candidates`` items against one ``--history`` of events)
with the same weights: the straightforward :meth:`DIN.forward` repeats the history per
candidate and builds ``[C, L, 4d]`` attention inputs; :class:`DinScorer` splits the first
attention layer (candidate term, history term once per request, product term). The figures are
medians over ``--repeats`` timed runs; the same run also checks that the two agree.
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

from scoring.model import DIN, DinScorer, ModelSpec
from streamrank.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--candidates", type=int, default=100, help="candidates per request")
    parser.add_argument("--history", type=int, default=50, help="history events per request")
    parser.add_argument(
        "--batch", type=int, nargs="+", default=[1, 32], help="requests per forward"
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per figure (median)")
    parser.add_argument("--seconds", type=float, default=0.5, help="minimum time per timed run")
    parser.add_argument("--artifact", type=Path, default=None, help="use this artifact's weights")


def _time(fn: Any, *, seconds: float, repeats: int) -> float:
    """Median seconds per call."""
    fn()  # warm up
    calls = 1
    while True:  # calls per run so one run lasts >= `seconds`
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds / 4:
            calls = max(1, int(calls * seconds / elapsed))
            break
        calls *= 2
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls)
    return statistics.median(runs)


def _plain(net: DIN, hist: torch.Tensor, mask: torch.Tensor, cands: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        result: torch.Tensor = net(hist, mask, cands)
        return result


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    torch.set_num_threads(settings.torch_threads)
    if args.artifact is not None:
        scorer = DinScorer.from_artifact(args.artifact)
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
        "torch_threads": settings.torch_threads,
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
        split = functools.partial(scorer.score_logits, hist, mask, cands)

        diff = float((straightforward().view(b, c) - split()).abs().max())
        t_plain = _time(straightforward, seconds=args.seconds, repeats=args.repeats)
        t_split = _time(split, seconds=args.seconds, repeats=args.repeats)
        out["results"].append(
            {
                "batch_requests": b,
                "straightforward_ms": round(t_plain * 1e3, 3),
                "split_ms": round(t_split * 1e3, 3),
                "straightforward_candidates_per_s": round(b * c / t_plain),
                "split_candidates_per_s": round(b * c / t_split),
                "speedup": round(t_plain / t_split, 2),
                "max_abs_logit_diff": diff,
            }
        )
    out["speedup_median"] = float(np.median([r["speedup"] for r in out["results"]]))
    return out
