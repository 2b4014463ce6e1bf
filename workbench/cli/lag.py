"""``streamrank lag``: consumer-group lag per partition and the member that owns it
(:mod:`workbench.lag`); ``--watch`` redraws it in place."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import orjson

from streamrank.settings import Settings
from workbench.cli.common import print_json, run_async


def _wanted(args: argparse.Namespace, settings: Settings) -> dict[str, tuple[str, str]]:
    groups = {
        "features": (settings.features.app_id, settings.topics.clicks),
        "scoring": (settings.scoring.group_id, settings.topics.requests),
    }
    if args.group and not args.worker:
        # any group: on --topic, or on the topic of the worker kind whose group it is
        known = {group: topic for group, topic in groups.values()}
        topic = args.topic or known.get(args.group)
        if topic is None:
            raise SystemExit(
                f"streamrank lag: say which topic group {args.group!r} reads: --topic T"
            )
        return {args.group: (args.group, topic)}
    wanted = {kind: groups[kind] for kind in ([args.worker] if args.worker else list(groups))}
    if args.group:
        wanted = {kind: (args.group, args.topic or topic) for kind, (_g, topic) in wanted.items()}
    return wanted


async def collect(settings: Settings, wanted: dict[str, tuple[str, str]]) -> dict[str, Any]:
    from workbench.lag import describe_lag, report

    infos = await asyncio.gather(
        *(describe_lag(settings, group, topic) for group, topic in wanted.values())
    )
    return {kind: report(info) for kind, info in zip(wanted, infos, strict=True)}


def render(reports: dict[str, Any]) -> Any:
    """The tables of ``streamrank lag`` (rich renderables)."""
    from rich.console import Group
    from rich.table import Table

    parts: list[Any] = []
    for kind, info in reports.items():
        title = (
            f"{kind}: group {info['group']} on {info['topic']} ({info['state'] or '?'}), "
            f"lag {info['total_lag']}; owners from {info['owners_from']}"
        )
        table = Table(title=title, title_justify="left", expand=False)
        for name, justify in (("partition", "right"), ("end", "right"), ("committed", "right"),
                              ("lag", "right"), ("owner", "left"), ("host", "left")):  # fmt: skip
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for row in info["partitions"]:
            table.add_row(
                str(row["partition"]),
                str(row["end_offset"]),
                "-" if row["committed"] is None else str(row["committed"]),
                str(row["lag"]),
                row["owner"] or "-",
                row["host"] or "-",
            )
        parts.append(table)
        for m in info["members"]:
            since = (
                time.strftime("%H:%M:%S", time.localtime(m["since"] / 1000)) if m["since"] else "?"
            )
            pid = f", pid {m['pid']}" if m["pid"] else ""
            parts.append(
                f"  member {m['member']} on {m['host'] or '?'}{pid}: partitions "
                f"{m['partitions'] or 'none'} (since {since})"
            )
        if not info["members"]:
            parts.append("  no members")
        if info.get("note"):
            parts.append(f"  note: {info['note']}")
    return Group(*parts)


def _lag(args: argparse.Namespace, settings: Settings) -> int:
    wanted = _wanted(args, settings)
    if args.watch is None:
        reports = run_async(collect(settings, wanted))
        if args.json:
            print_json(reports)
        else:
            from rich.console import Console

            Console().print(render(reports))
        return 0
    try:
        return int(run_async(_watch(settings, wanted, every_s=args.watch, as_json=args.json)))
    except KeyboardInterrupt:  # Ctrl-C is how a watch ends
        return 0


async def _watch(
    settings: Settings, wanted: dict[str, tuple[str, str]], *, every_s: float, as_json: bool
) -> int:
    """Redraw every ``every_s`` until Ctrl-C (JSON: one document per refresh)."""
    from rich.console import Console
    from rich.live import Live

    if as_json:  # JSON lines: one document per refresh
        while True:
            sys.stdout.write(orjson.dumps(await collect(settings, wanted)).decode() + "\n")
            sys.stdout.flush()
            await asyncio.sleep(every_s)
    with Live(
        render(await collect(settings, wanted)), console=Console(), auto_refresh=False
    ) as live:
        while True:
            await asyncio.sleep(every_s)
            live.update(render(await collect(settings, wanted)), refresh=True)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "lag", help="consumer-group lag per partition and who owns it (features, scoring)"
    )
    parser.add_argument("worker", nargs="?", choices=("features", "scoring"))
    parser.add_argument("--group", help="consumer group id (default: the worker kind's setting)")
    parser.add_argument("--topic", help="topic of --group (default: the worker kind's topic)")
    parser.add_argument(
        "--json", action="store_true", help="one JSON document (with --watch: one line each)"
    )
    parser.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="refresh until Ctrl-C (every 2 s, or SECONDS)",
    )
    parser.set_defaults(func=_lag)
