"""``streamrank bench report``: PNG figures for the docs from the benchmarks' JSON files.

    streamrank bench scoring --json --out scoring.json
    streamrank bench embeddings --json --out embeddings.json
    streamrank bench streams --json --out streams.json
    streamrank bench report --scoring scoring.json --embeddings embeddings.json \\
        --streams streams.json --docs docs

draws into ``DOCS/figures/``: ``scoring_latency.png`` (p50/p99 against offered load: ours, the
echo floor, and max req/s of ours, echo, naive and the forward alone), ``scoring_stages.png``
(where one request's worker time goes, stacked), ``cache_hit_rate.png`` (ours, LRU, Belady
against cache size) and ``streams_throughput.png`` (feature worker events/s against the raw
consume ceiling). Each figure is drawn only when its input is given; every input is read and
checked before anything is drawn.

:mod:`workbench.bench.report_series` takes the numbers out of the results (pure, tested
without matplotlib); the ``draw_*`` functions here only draw them (matplotlib's Agg canvas,
imported when drawing).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamrank.errors import ConfigError
from streamrank.settings import Settings
from workbench.bench.report_series import (
    HitRateSeries,
    ScoringSeries,
    StageBars,
    StreamsSeries,
    hit_rate_series,
    load_result,
    scoring_series,
    stage_bars,
    streams_series,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

FILES = {
    "scoring_latency": "scoring_latency.png",
    "scoring_stages": "scoring_stages.png",
    "cache_hit_rate": "cache_hit_rate.png",
    "streams_throughput": "streams_throughput.png",
}
# The performance goals (docs/benchmarks.md), drawn as reference lines.
GOAL_P99_MS_AT_200 = 25.0
GOAL_EVENTS_VS_RAW = 0.5
GOAL_CLICK_VISIBLE_P99_MS = 20.0
DPI = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scoring", type=Path, metavar="FILE", help="JSON of `streamrank bench scoring --out`"
    )
    parser.add_argument(
        "--embeddings",
        type=Path,
        metavar="FILE",
        help="JSON of `streamrank bench embeddings --out`",
    )
    parser.add_argument(
        "--streams",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="JSON of `streamrank bench streams --out` (several files: one bar pair per run)",
    )
    parser.add_argument(
        "--docs",
        type=Path,
        default=Path("docs"),
        metavar="DIR",
        help="docs folder; figures go to DOCS/figures",
    )


# --- drawing (thin) ----------------------------------------------------------------------------


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # the Agg canvas: PNG without a display, no pyplot global state
    return fig


def _save(fig: Figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI)
    logger.info("drew %s (%d bytes)", path, path.stat().st_size)


def draw_scoring_latency(series: ScoringSeries, path: Path) -> None:
    fig = _figure(11, 4.4)
    ax, bars = fig.subplots(1, 2, width_ratios=[3, 2])
    curves = [(series.ours, "tab:blue")]
    if series.echo is not None:
        curves.append((series.echo, "tab:gray"))
    if series.floor is not None:
        curves.append((series.floor, "black"))
    for curve, color in curves:
        ax.plot(curve.rates, curve.p50_ms, "o-", color=color, label=f"{curve.label} p50")
        ax.plot(curve.rates, curve.p99_ms, "s--", color=color, label=f"{curve.label} p99")
    ax.axhline(GOAL_P99_MS_AT_200, color="tab:red", lw=0.8, ls=":", label="goal p99 (200 req/s)")
    naive = series.max_rps["naive"]
    ax.axvline(naive, color="tab:orange", lw=1, ls="-.", label=f"naive max {naive:g} req/s")
    ax.set_yscale("log")
    ax.set_xlim(left=0)
    ax.set_xlabel("offered load (req/s)")
    ax.set_ylabel("latency, send -> reply (ms, log)")
    if series.echo is None:
        ax.set_title("no echo baseline in this run", fontsize=9, color="tab:gray")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    names = list(series.max_rps)
    values = [series.max_rps[n] for n in names]
    colors = {"ours": "tab:blue", "echo floor": "tab:gray", "true floor": "black",
              "previous scorer": "tab:purple", "naive": "tab:orange"}  # fmt: skip
    drawn = bars.bar(names, values, color=[colors.get(n, "tab:green") for n in names])
    bars.bar_label(drawn, labels=[f"{v:,.0f}" for v in values], fontsize=8)
    bars.tick_params(axis="x", labelrotation=30, labelsize=8)  # long names would overlap
    bars.set_ylabel("max req/s (one worker)")
    bars.yaxis.set_major_formatter("{x:,.0f}")
    bars.grid(True, axis="y", alpha=0.3)
    fig.suptitle(series.title, fontsize=10)
    _save(fig, path)


STAGE_COLORS = {
    "queue_wait": "tab:gray",
    "sequence_fetch": "tab:blue",
    "embedding_lookup": "tab:purple",
    "forward": "tab:orange",
    "other": "tab:olive",
}


def draw_stages(series: StageBars, path: Path) -> None:
    """100%-stacked bars (the totals differ by orders of magnitude), each bar's total and each
    visible stage's ms written on it."""
    fig = _figure(9, 4.6)
    ax = fig.subplots()
    x = list(range(len(series.labels)))
    bottom = [0.0] * len(x)
    for stage in series.stages:
        share = [
            100 * ms / t if t else 0.0
            for ms, t in zip(series.ms[stage], series.totals, strict=True)
        ]
        drawn = ax.bar(
            x, share, bottom=bottom, label=stage.replace("_", " "), color=STAGE_COLORS.get(stage)
        )
        labels = [
            f"{ms:.2f}" if s >= 6 else "" for ms, s in zip(series.ms[stage], share, strict=True)
        ]
        ax.bar_label(drawn, labels=labels, label_type="center", fontsize=7)
        bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    for n, total in enumerate(series.totals):
        ax.text(n, 101, f"{total:,.1f} ms", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, series.labels, fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_ylabel("share of the worker's time per request (%)")
    ax.set_title(
        "Scoring: where one request's worker time goes (mean ms per stage on the bars)", fontsize=10
    )
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    _save(fig, path)


def draw_hit_rate(series: HitRateSeries, path: Path) -> None:
    fig = _figure(7.5, 4.4)
    ax = fig.subplots()
    styles = {
        "ours (W-TinyLFU)": ("o-", "tab:blue"),
        "LRU": ("s--", "tab:orange"),
        "Belady (optimum)": ("^:", "tab:green"),
    }
    for label, values in series.curves.items():
        marker, color = styles.get(label, ("x-", None))
        ax.plot(series.capacity_pct, values, marker, color=color, label=label)
    ax.set_xscale("log")
    ax.set_xticks(series.capacity_pct, [f"{c:g}%" for c in series.capacity_pct])
    ax.set_xlabel("cache size (% of the table, log)")
    ax.set_ylabel("hit rate (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(series.title, fontsize=10)
    _save(fig, path)


def draw_streams(series: StreamsSeries, path: Path) -> None:
    fig = _figure(10, 4.2)
    ax, lat = fig.subplots(1, 2, width_ratios=[3, 2])
    x = list(range(len(series.runs)))
    w = 0.38
    raw = ax.bar(
        [i - w / 2 for i in x],
        series.raw_consume_per_s,
        w,
        color="tab:gray",
        label="raw aiokafka consume (ceiling)",
    )
    ours = ax.bar(
        [i + w / 2 for i in x], series.events_per_s, w, color="tab:blue", label="feature worker"
    )
    ax.bar_label(raw, labels=[f"{v:,.0f}" for v in series.raw_consume_per_s], fontsize=8)
    ax.bar_label(
        ours,
        labels=[
            f"{e:,.0f}\n{e / r:.0%}"
            for e, r in zip(series.events_per_s, series.raw_consume_per_s, strict=True)
        ],
        fontsize=8,
    )
    goal = [GOAL_EVENTS_VS_RAW * r for r in series.raw_consume_per_s]
    ax.hlines(
        goal,
        [i - w for i in x],
        [i + w for i in x],
        colors="tab:red",
        linestyles=":",
        label=f"goal: {GOAL_EVENTS_VS_RAW:.0%} of the ceiling",
    )
    ax.set_xticks(x, series.runs)
    ax.set_xlim(-0.9, len(x) - 0.1)
    ax.yaxis.set_major_formatter("{x:,.0f}")
    ax.set_ylabel("events/s")
    ax.set_ylim(0, 1.2 * max(series.raw_consume_per_s + series.events_per_s))
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)
    p50 = [v or 0.0 for v in series.latency_p50_ms]
    p99 = [v or 0.0 for v in series.latency_p99_ms]
    lat.bar([i - w / 2 for i in x], p50, w, color="tab:cyan", label="p50")
    lat.bar([i + w / 2 for i in x], p99, w, color="tab:blue", label="p99")
    lat.axhline(GOAL_CLICK_VISIBLE_P99_MS, color="tab:red", ls=":", lw=0.8, label="goal p99")
    lat.set_xticks(x, series.runs)
    lat.set_xlim(-0.9, len(x) - 0.1)
    lat.set_ylabel("click -> visible in Redis (ms)")
    lat.legend(fontsize=8)
    lat.grid(True, axis="y", alpha=0.3)
    fig.suptitle(series.title, fontsize=10)
    _save(fig, path)


# --- the command -------------------------------------------------------------------------------


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """Read and check every input, then draw the figures they give; the paths drawn."""
    del settings  # reads files only
    if not (args.scoring or args.embeddings or args.streams):
        raise ConfigError(
            "give at least one of --scoring, --embeddings, --streams (JSON files "
            "written by `streamrank bench NAME --out FILE`)"
        )
    out_dir: Path = args.docs / "figures"
    todo: list[tuple[str, Callable[[Path], None]]] = []
    scoring: ScoringSeries | None = None
    if args.scoring:
        result = load_result(args.scoring, "scoring")
        source = str(args.scoring)
        scoring = scoring_series(result, source=source)
        todo.append(("scoring_latency", partial(draw_scoring_latency, scoring)))
        todo.append(("scoring_stages", partial(draw_stages, stage_bars(result, source=source))))
    if args.embeddings:
        hit_rate = hit_rate_series(
            load_result(args.embeddings, "embeddings"), source=str(args.embeddings)
        )
        todo.append(("cache_hit_rate", partial(draw_hit_rate, hit_rate)))
    if args.streams:
        results = [(str(p), load_result(p, "streams")) for p in args.streams]
        todo.append(("streams_throughput", partial(draw_streams, streams_series(results))))
    figures = {}
    for name, draw in todo:
        path = out_dir / FILES[name]
        draw(path)
        figures[name] = str(path)
    return {
        "figures": figures,
        "not_drawn": sorted(set(FILES) - set(figures)),
        # None: no scoring result given; False: it has no echo baseline (drawn without)
        "echo_baseline": None if scoring is None else scoring.echo is not None,
    }
