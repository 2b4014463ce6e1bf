"""``streamrank embeddings versions|info|delete``: inspect and clean up the embedding store."""

from __future__ import annotations

import argparse
from typing import Any

from scoring.embeddings.store import EmbeddingStore
from scoring.model.registry import delete_version
from streamrank import keys
from streamrank.settings import Settings


def store_from(settings: Settings) -> EmbeddingStore:
    """A store owning a client on the settings' Redis."""
    return EmbeddingStore.from_settings(settings)


async def _versions(settings: Settings) -> list[str]:
    async with store_from(settings) as store:
        return await store.versions()


async def _info(settings: Settings, version: str, tables: list[str]) -> list[dict[str, Any]]:
    async with store_from(settings) as store:
        return [(await store.table_meta(version, t)).as_dict() for t in tables]


async def _delete(settings: Settings, version: str, force: bool) -> int:
    async with store_from(settings) as store:
        return await delete_version(store, version, force=force)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.cli.common import print_json, run_async

    if args.action == "versions":
        versions = run_async(_versions(settings))
        if args.json:
            print_json({"versions": versions})
        else:
            print("\n".join(versions) if versions else "no published embedding versions")
        return 0
    if args.action == "info":
        metas = run_async(_info(settings, args.version, args.table or [keys.ITEM_TABLE]))
        if args.json:
            print_json(metas)
        else:
            for meta in metas:
                print(" ".join(f"{k}={v}" for k, v in meta.items()))
        return 0
    deleted = run_async(_delete(settings, args.version, args.force))
    if args.json:
        print_json({"version": args.version, "keys_deleted": deleted})
    else:
        print(f"deleted embedding version {args.version} ({deleted} keys)")
    return 0


def register(sub: Any) -> None:
    emb = sub.add_parser("embeddings", help="list, inspect and delete embedding store versions")
    actions = emb.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    versions = actions.add_parser("versions", help="list the published versions")
    info = actions.add_parser("info", help="metadata of a version's tables")
    info.add_argument("version")
    info.add_argument("--table", action="append", default=None, help="table (default: item)")
    delete = actions.add_parser("delete", help="delete every key of a version (SCAN + UNLINK)")
    delete.add_argument("version")
    delete.add_argument(
        "--force",
        action="store_true",
        help="delete even the active model version or one in the canary split",
    )
    for parser in (versions, info, delete):
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.set_defaults(func=_run)
