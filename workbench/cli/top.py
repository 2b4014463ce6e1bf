"""``streamrank top``: the live terminal dashboard of the workers (:mod:`workbench.top`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import orjson

from streamrank.runtime.signals import run_until_signalled
from streamrank.settings import Settings
from workbench.cli.common import print_json


def targets(args: argparse.Namespace) -> list[tuple[str, str]]:
    from workbench.top import default_url

    features = args.features or [default_url("features")]
    scoring = args.scoring or [default_url("scoring")]
    return [("features", u) for u in features] + [("scoring", u) for u in scoring]


async def dashboard(
    wanted: list[tuple[str, str]], *, every_s: float, once: bool, as_json: bool
) -> None:
    """Scrape every ``every_s`` and redraw (in place on a terminal; a new table per refresh
    otherwise); ``once``: one window of ``every_s`` and stop."""
    from rich.console import Console
    from rich.live import Live

    from workbench.top import figures, render, scrape_all

    console = Console()
    before = await scrape_all(wanted)
    if once:
        await asyncio.sleep(every_s)
        result = figures(await scrape_all(wanted), before)
        if as_json:
            print_json(result)
        else:
            console.print(render(result))
        return
    if as_json or not console.is_terminal:
        while True:
            await asyncio.sleep(every_s)
            now = await scrape_all(wanted)
            result = figures(now, before)
            before = now
            if as_json:
                sys.stdout.write(orjson.dumps(result).decode() + "\n")
                sys.stdout.flush()
            else:
                console.print(render(result))
    with Live(render(figures(before, [])), console=console, auto_refresh=False) as live:
        while True:
            await asyncio.sleep(every_s)
            now = await scrape_all(wanted)
            live.update(render(figures(now, before)), refresh=True)
            before = now


def _top(args: argparse.Namespace, settings: Settings) -> int:
    run_until_signalled(
        dashboard(targets(args), every_s=args.every, once=args.once, as_json=args.json)
    )
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "top", help="live dashboard of the workers (throughput, latency, lag, models) from /metrics"
    )
    parser.add_argument(
        "--features", action="append", metavar="URL",
        help="a features worker's /metrics (repeatable; default http://127.0.0.1:9464/metrics)",
    )  # fmt: skip
    parser.add_argument(
        "--scoring", action="append", metavar="URL",
        help="a scoring worker's /metrics (repeatable; default http://127.0.0.1:9465/metrics)",
    )  # fmt: skip
    parser.add_argument("--every", type=float, default=2.0, help="seconds between refreshes")
    parser.add_argument("--once", action="store_true", help="one window of --every, then exit")
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    parser.set_defaults(func=_top)
