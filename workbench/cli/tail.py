"""``streamrank tail TOPIC``: read a topic as a table or JSON lines (:mod:`workbench.tail`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from streamrank.runtime.signals import run_until_signalled
from streamrank.settings import Settings


def start_from(args: argparse.Namespace) -> Any:
    """The :class:`workbench.tail.Start` of the flags (one of them at most)."""
    from workbench.tail import DEFAULT_LAST, Start, parse_duration

    if args.from_beginning:
        return Start("beginning", 0)
    if args.since is not None:
        return Start("since", parse_duration(args.since))
    if args.offset is not None:
        return Start("offset", args.offset)
    if args.last is not None:
        return Start("last", args.last)
    return Start("last", DEFAULT_LAST)


def filters_from(args: argparse.Namespace) -> Any:
    from workbench.tail import Filters

    return Filters(
        user=args.user,
        request_id=args.request_id,
        model_version=args.model_version,
        degraded=args.degraded,
        reason=args.reason,
        min_score=args.min_score,
    )


def add_reading_flags(parser: argparse.ArgumentParser) -> None:
    """Where to start, how much to read, and the filters (shared with ``streamrank dlq``)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--from-beginning", action="store_true", help="from the first offset")
    where.add_argument("--since", metavar="DURATION", help="from this long ago: 30s, 10m, 2h, 1d")
    where.add_argument("--offset", type=int, help="from this offset in each partition")
    where.add_argument(
        "--last", type=int, metavar="N", help="the N newest of each partition (default 10)"
    )
    parser.add_argument(
        "--partition", type=int, action="append", help="only this partition (repeatable)"
    )
    parser.add_argument("--limit", type=int, help="stop after N matching messages")
    parser.add_argument("--user", help="only messages of this user_id")
    parser.add_argument("--request-id", help="only this request_id")
    parser.add_argument("--model-version", help="only replies of this model version")
    parser.add_argument("--degraded", action="store_true", help="only degraded replies")
    parser.add_argument(
        "--reason", help="only replies or dead letters whose reason starts with this"
    )
    parser.add_argument(
        "--min-score", type=float, help="only replies whose best score is at least this"
    )
    parser.add_argument("--json", action="store_true", help="JSON lines, one message per line")


def _tail(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.tail import TailStats, header, json_line, kind_of, table_row, tail

    topic = args.topic
    kind = kind_of(topic, settings)
    out = sys.stdout
    stats = TailStats()
    printed_header = False

    def emit(message: Any) -> None:
        nonlocal printed_header
        if args.json:
            out.write(json_line(message).decode() + "\n")
        else:
            if not printed_header:
                out.write(header(kind) + "\n")
                printed_header = True
            out.write(table_row(kind, message, top=args.top) + "\n")
        out.flush()

    try:
        run_until_signalled(
            tail(
                settings,
                topic,
                start=start_from(args),
                follow=args.follow,
                limit=args.limit,
                filters=filters_from(args),
                emit=emit,
                stats=stats,
                partitions=args.partition,
            )
        )
    except BrokenPipeError:  # `| head`: the reader is gone, and so are we
        sys.stderr.close()
        return 0
    invalid = f", {stats.invalid} not valid JSON" if stats.invalid else ""
    print(
        f"tail: {stats.read} messages read from {topic} ({stats.partitions} partitions), "
        f"{stats.shown} shown{invalid}",
        file=sys.stderr,
    )
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "tail",
        help="read a topic (results, clicks, dead letters, ...) as a table or JSON lines; "
        "never joins a consumer group",
    )
    parser.add_argument("topic", help="e.g. rank-results, clicks, dead-letters")
    parser.add_argument("--follow", "-f", action="store_true", help="keep reading new messages")
    parser.add_argument("--top", type=int, default=5, help="top items shown per reply")
    add_reading_flags(parser)
    parser.set_defaults(func=_tail)
