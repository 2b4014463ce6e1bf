"""``streamrank items publish FILE``: ItemEvents from a JSON-lines file to the items topic."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from schemas import ItemEvent, Limits, decode_item
from streamrank.errors import ContractError
from streamrank.settings import Settings
from workbench.cli.common import print_json, run_async


def read_items(path: Path, limits: Limits) -> list[ItemEvent]:
    """Every line of ``path`` as an ItemEvent (blank lines skipped); a bad line stops it all
    with its line number and the contract's reason, before anything is sent."""
    events = []
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                events.append(decode_item(line, limits))
            except ContractError as exc:
                raise SystemExit(f"streamrank items publish: {path}:{number}: {exc}") from None
    return events


async def publish_items(settings: Settings, events: Iterable[ItemEvent]) -> int:
    """Produce ``events`` to the items topic (key = item_id), acknowledged by every replica;
    returns how many were sent."""
    from streamrank.kafka import clients as kafka

    producer = kafka.producer(settings.kafka, acks="all", linger_ms=5)
    await producer.start()
    sent = 0
    try:
        for event in events:
            await producer.send(settings.topics.items, event.to_json(), key=event.item_id.encode())
            sent += 1
        await producer.flush()
    finally:
        await producer.stop()
    return sent


def _publish(args: argparse.Namespace, settings: Settings) -> int:
    events = read_items(args.file, Limits.from_settings(settings.limits))
    sent = run_async(publish_items(settings, events))
    if args.json:
        print_json({"topic": settings.topics.items, "sent": sent})
    else:
        print(f"sent {sent} item events to {settings.topics.items}")
    return 0


def register(sub: Any) -> None:
    items = sub.add_parser("items", help="new or changed items (the items topic)")
    areas = items.add_subparsers(dest="items_command", metavar="COMMAND")
    areas.required = True
    publish = areas.add_parser(
        "publish",
        help="produce ItemEvents from a JSON-lines file (one {item_id, category, attributes, "
        "ts} per line) to the items topic",
    )
    publish.add_argument("file", type=Path, help="the JSON-lines file")
    publish.add_argument("--json", action="store_true", help="print one JSON object")
    publish.set_defaults(func=_publish)
