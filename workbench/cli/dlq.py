"""``streamrank dlq``: dead letters by reason and source topic, listed, or replayed
(:mod:`workbench.dlq`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from streamrank.runtime.signals import run_until_signalled
from streamrank.settings import Settings
from workbench.cli.common import print_json
from workbench.cli.tail import add_reading_flags, filters_from


def _start(args: argparse.Namespace) -> Any:
    from workbench.cli.tail import start_from
    from workbench.tail import Start

    explicit = args.since is not None or args.offset is not None or args.last is not None
    return start_from(args) if explicit else Start("beginning", 0)  # default: all of them


def _dlq(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.dlq import counts, read_letters, replay
    from workbench.tail import header, json_line, table_row

    letters, unreadable = run_until_signalled(
        read_letters(
            settings,
            start=_start(args),
            filters=filters_from(args),
            source_topic=args.source_topic,
            limit=args.limit,
        )
    ) or ([], 0)
    note = f" ({unreadable} records that are not dead letters skipped)" if unreadable else ""
    if args.replay:
        result = run_until_signalled(
            replay(settings, letters, confirm=args.yes, to_topic=args.to_topic)
        )
        if args.json:
            print_json(result)
        elif result["dry_run"]:
            where = ", ".join(f"{n} to {t}" for t, n in result["to"].items()) or "nothing"
            print(
                f"dlq: would replay {result['selected']} dead letters ({where}){note}; "
                "add --yes to do it"
            )
        else:
            where = ", ".join(f"{n} to {t}" for t, n in result["to"].items()) or "nothing"
            print(f"dlq: replayed {result['replayed']} dead letters ({where}){note}")
        return 0
    if args.list:
        if not args.json:
            print(header("dead_letters"))
        for x in letters:
            if args.json:
                print(json_line(x.message).decode())
            else:
                print(table_row("dead_letters", x.message))
        print(f"dlq: {len(letters)} dead letters{note}", file=sys.stderr)
        return 0
    table = counts(letters)
    if args.json:
        print_json({"total": len(letters), "unreadable": unreadable, "by_reason": table})
        return 0
    width = max([len(r["reason"]) for r in table] + [6])
    print(f"{'reason'.ljust(width)}  {'count':>7}  source topic")
    for row in table:
        print(f"{row['reason'].ljust(width)}  {row['count']:>7}  {row['source_topic']}")
    print(f"{'total'.ljust(width)}  {len(letters):>7}{note}")
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "dlq",
        help="dead letters: counts by reason and source topic, --list, or --replay the "
        "original bytes to their source topic",
    )
    parser.add_argument("--source-topic", help="only dead letters from this topic")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--list", action="store_true", help="list them (like tail)")
    action.add_argument(
        "--replay",
        action="store_true",
        help="re-publish the selected dead letters' original bytes and headers to their "
        "source topic (a dry run unless --yes)",
    )
    parser.add_argument("--yes", action="store_true", help="with --replay: really do it")
    parser.add_argument("--to-topic", help="with --replay: publish here instead")
    add_reading_flags(parser)
    parser.set_defaults(func=_dlq)
