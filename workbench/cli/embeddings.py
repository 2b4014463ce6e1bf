"""``streamrank embeddings versions|info|delete|upsert``: inspect and clean up the embedding store,
and upsert rows into a table's overlay (from a file, or a topic as a long-running consumer)."""

from __future__ import annotations

import argparse
from pathlib import Path
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
        return [
            {
                **(await store.table_meta(version, t)).as_dict(),
                **await store.overlay_info(version, t),
            }
            for t in tables
        ]


def _read_rows(path: Path, ids_path: Path | None, dim: int, encoding: str) -> tuple[list[str], Any]:
    """The rows of a JSON-lines file, or of a ``.npy`` matrix with one id per line in ``ids``."""
    import numpy as np

    from scoring.embeddings.overlay import read_jsonl
    from streamrank.errors import ConfigError

    if path.suffix == ".npy":
        if ids_path is None:
            raise ConfigError(f"{path} is a matrix: give its ids with --ids FILE (one per line)")
        ids = [line for line in ids_path.read_text().splitlines() if line]
        return ids, np.load(path, allow_pickle=False)
    if ids_path is not None:
        raise ConfigError("--ids goes with a .npy matrix; JSON lines carry their ids")
    return read_jsonl(str(path), dim=dim, encoding=encoding)


async def _upsert(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    async with store_from(settings) as store:
        meta = await store.table_meta(args.version, args.table)
        ids, matrix = _read_rows(args.file, args.ids, meta.dim, meta.encoding)
        report = await store.upsert(args.table, ids, matrix, version=args.version)
        return {**report.as_dict(), **await store.overlay_info(args.version, args.table)}


def _run_upsert(args: argparse.Namespace, settings: Settings) -> int:
    from streamrank.errors import ConfigError
    from workbench.cli.common import print_json, run_async

    if (args.file is None) == (args.topic is None):
        raise ConfigError("give either --file PATH or --topic TOPIC")
    if args.topic is not None:
        from prometheus_client import CollectorRegistry

        from scoring.embeddings.overlay_worker import OverlayWorker
        from streamrank.runtime.worker import serve

        worker = OverlayWorker(
            settings=settings,
            version=args.version,
            table=args.table,
            topic=args.topic,
            registry=CollectorRegistry(),
        )
        serve(worker, metrics_port=args.metrics_port)
        return 0
    report = run_async(_upsert(settings, args))
    if args.json:
        print_json(report)
    else:
        print(
            f"upserted {report['rows']} rows ({report['new_rows']} new) into the overlay of "
            f"{args.version}/{args.table}: overlay id {report['overlay_id']}, "
            f"{report['overlay_rows']} overlay rows"
        )
    return 0


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
    upsert = actions.add_parser(
        "upsert", help="write rows of new or changed ids into the overlay of a published table"
    )
    upsert.add_argument("--version", required=True)
    upsert.add_argument("--table", default=keys.ITEM_TABLE, help="table (default: item)")
    upsert.add_argument(
        "--file", type=Path, help='JSON lines {"id": ..., "vector": [...]}, or a .npy matrix'
    )
    upsert.add_argument("--ids", type=Path, help="with a .npy matrix: its ids, one per line")
    upsert.add_argument(
        "--topic", help="consume rows (the same JSON) from this topic until stopped (a worker)"
    )
    upsert.add_argument("--metrics-port", type=int, default=None, help="with --topic")
    upsert.add_argument("--json", action="store_true", help="print JSON")
    upsert.set_defaults(func=_run_upsert)
