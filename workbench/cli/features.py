"""Commands of the features area: ``worker features``, ``features --user U`` and ``features
load`` (the attribute tables)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from streamrank.settings import Settings
from workbench.cli.common import print_json, run_async, worker_kinds


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from streams.worker import serve

    return serve(settings, metrics_port=args.metrics_port)


def _features(args: argparse.Namespace, settings: Settings) -> int:
    from streams.reader import read_user_features

    if not args.user:
        raise SystemExit(
            "streamrank features: give --user U (or `features load` to load attributes)"
        )
    result = run_async(read_user_features(settings, args.user, as_of_ms=args.as_of))
    if args.json:
        print_json(result)
        return 0
    counters = result["counters"]
    print(
        f"user {result['user_id']} as of {result['as_of']}: {len(result['sequence'])} events; "
        f"clicks 1h {counters['clicks_1h']}, 24h {counters['clicks_24h']}; categories 24h "
        f"{counters['categories_24h']}; attributes {result['attributes']}"
    )
    for event in result["sequence"]:
        print(
            f"  {event['ts']}  {event['event_id']}  {event['item_id']}  {event['category'] or ''}"
            f"  {event['action'] or ''}"
        )
    return 0


def attribute_files(
    data: Path | None, users: Path | None, items: Path | None
) -> tuple[Path | None, Path | None]:
    """The user and item files to load: the ones given, else those found in ``data`` (a
    folder with ``ml-100k.user``/``.item`` (RecBole) or ``u.user``/``u.item`` (GroupLens), or
    the datasets folder holding ``ml-100k/``)."""
    if data is not None and users is None and items is None:
        if not data.is_dir():
            raise SystemExit(f"streamrank features load: --data {data} is not a folder")
        folder = data / "ml-100k" if (data / "ml-100k").is_dir() else data
        for user_name, item_name in (("ml-100k.user", "ml-100k.item"), ("u.user", "u.item")):
            if (folder / user_name).exists() or (folder / item_name).exists():
                found_users, found_items = folder / user_name, folder / item_name
                return (
                    found_users if found_users.exists() else None,
                    found_items if found_items.exists() else None,
                )
        raise SystemExit(
            f"streamrank features load: no ml-100k.user/.item (RecBole) or u.user/u.item "
            f"(GroupLens) in {folder}; pass --users FILE and/or --items FILE"
        )
    for flag, path in (("--users", users), ("--items", items)):
        if path is not None and not path.is_file():
            raise SystemExit(f"streamrank features load: {flag} {path}: no such file")
    return users, items


async def load_attributes(
    settings: Settings,
    users: dict[str, dict[str, str]],
    items: dict[str, dict[str, str]],
    *,
    user_prefix: str,
    progress: bool,
) -> dict[str, int]:
    """Write the attribute tables with a progress bar (users and items written)."""
    from tqdm import tqdm

    from streamrank.redis.client import redis_client
    from streams.attributes import write_attributes

    client = redis_client(settings.redis)
    try:
        total = len(users) + len(items)
        with tqdm(total=total, desc="attributes", unit="row", disable=not progress) as bar:
            return await write_attributes(
                client, users=users, items=items, user_prefix=user_prefix, progress=bar.update
            )
    finally:
        await client.aclose()


def _load(args: argparse.Namespace, settings: Settings) -> int:
    import sys

    from scoring.training.movielens_files import read_item_categories, read_user_attributes

    data = args.data
    if data is None and args.users is None and args.items is None:
        data = settings.tools.data_dir
    user_file, item_file = attribute_files(data, args.users, args.items)
    users = read_user_attributes(user_file) if user_file else {}
    items = (
        {i: {"category": c} for i, c in read_item_categories(item_file).items()}
        if item_file
        else {}
    )
    counts = run_async(
        load_attributes(
            settings, users, items, user_prefix=args.user_prefix, progress=sys.stderr.isatty()
        )
    )
    print_json(
        {
            **counts,
            "user_file": str(user_file) if user_file else None,
            "item_file": str(item_file) if item_file else None,
            "user_prefix": args.user_prefix,
        }
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

    features = sub.add_parser(
        "features", help="print one user's features (sequence, counters, attributes); `load`"
    )
    features.add_argument("--user", help="user id")
    features.add_argument(
        "--as-of",
        type=int,
        default=None,
        metavar="MS",
        help="epoch ms: the events before it, windows closed at it (default now)",
    )
    features.add_argument("--json", action="store_true", help="print one JSON object")
    features.set_defaults(func=_features)
    areas = features.add_subparsers(dest="features_command", metavar="COMMAND")
    load = areas.add_parser(
        "load", help="load user and item attributes (MovieLens files) into the Redis tables"
    )
    load.add_argument("--users", type=Path, help="a ml-100k.user (RecBole) or u.user file")
    load.add_argument("--items", type=Path, help="a ml-100k.item (RecBole) or u.item file")
    load.add_argument(
        "--data",
        type=Path,
        help="a folder holding both (or the datasets folder holding ml-100k/); the default "
        "when neither file is given: STREAMRANK_DATA_DIR",
    )
    load.add_argument(
        "--user-prefix", default="", help="put before every user id (a replay's run id)"
    )
    load.set_defaults(func=_load)
