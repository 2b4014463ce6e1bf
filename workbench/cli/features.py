"""Commands of the features area: ``worker features`` and ``features --user U``."""

from __future__ import annotations

import argparse
from typing import Any

from streamrank.settings import Settings
from workbench.cli.common import print_json, run_async, worker_kinds


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from streams.worker import serve

    return serve(settings, metrics_port=args.metrics_port)


def _features(args: argparse.Namespace, settings: Settings) -> int:
    from streams.reader import read_user_features

    result = run_async(read_user_features(settings, args.user))
    if args.json:
        print_json(result)
        return 0
    counters = result["counters"]
    print(
        f"user {result['user_id']}: {len(result['sequence'])} events; clicks 1h "
        f"{counters['clicks_1h']}, 24h {counters['clicks_24h']}; categories 24h "
        f"{counters['categories_24h']}"
    )
    for event in result["sequence"]:
        print(
            f"  {event['ts']}  {event['event_id']}  {event['item_id']}  {event['category'] or ''}"
        )
    return 0


def register(sub: Any) -> None:
    worker = worker_kinds(sub).add_parser(
        "features", help="consume clicks into Redis sequences and counters (Faust worker)"
    )
    worker.add_argument(
        "--metrics-port", type=int, default=None, help="/metrics port (0 disables; default 9464)"
    )
    worker.add_argument(
        "--path",
        dest="features_path",
        choices=("batch", "agent"),
        default=None,
        help="how Faust hands records over (setting features_path)",
    )
    worker.set_defaults(func=_worker, setting_flags={"features_path": "STREAMRANK_FEATURES_PATH"})

    features = sub.add_parser("features", help="print one user's sequence and counters")
    features.add_argument("--user", required=True, help="user id")
    features.add_argument("--json", action="store_true", help="print one JSON object")
    features.set_defaults(func=_features)
