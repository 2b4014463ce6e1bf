"""``streamrank lag``: consumer-group lag per partition (:mod:`streamrank.lag`)."""

from __future__ import annotations

import argparse
from typing import Any

from streamrank.cli.common import print_json, run_async
from streamrank.lag import group_lag, summarise
from streamrank.settings import Settings


def _lag(args: argparse.Namespace, settings: Settings) -> int:
    groups = {
        "features": (settings.features_app_id, settings.topic_clicks),
        "scoring": (settings.scoring_group_id, settings.topic_requests),
    }
    wanted = [args.worker] if args.worker else list(groups)
    report = {}
    for kind in wanted:
        group, topic = groups[kind]
        if args.group:
            group = args.group
        summary = summarise(run_async(group_lag(settings, group, topic)))
        report[kind] = {"group": group, "topic": topic, **summary}
    if args.json:
        print_json(report)
        return 0
    for kind, info in report.items():
        print(f"{kind}: group {info['group']} on {info['topic']}: lag {info['total_lag']}")
        for row in info["partitions"]:
            print(
                f"  partition {row['partition']}: end {row['end_offset']}, "
                f"committed {row['committed']}, lag {row['lag']}"
            )
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser("lag", help="consumer-group lag per partition (features, scoring)")
    parser.add_argument("worker", nargs="?", choices=("features", "scoring"))
    parser.add_argument("--group", help="consumer group id (default: the worker kind's setting)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=_lag)
