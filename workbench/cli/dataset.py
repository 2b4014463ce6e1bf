"""``streamrank dataset export`` (served log + outcomes -> training samples) and the handler of
``streamrank train --from-dataset`` (registered with ``train`` in :mod:`workbench.cli.model`)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from streamrank import clock
from streamrank.settings import Settings


def parse_time(text: str | None) -> int | None:
    """Epoch ms of ``--since/--until``: epoch ms, an ISO 8601 time (UTC unless it says), or a
    duration back from now (``30m``, ``2h``, ``1d``)."""
    if text is None:
        return None
    from workbench.tail import parse_duration

    value = text.strip()
    if value.isdigit():
        return int(value)
    try:
        return clock.now_ms() - int(parse_duration(value) * 1000)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise SystemExit(
            f"streamrank dataset export: {text!r} is not a time: use epoch ms, an ISO 8601 time "
            "(2026-12-01T13:00) or a duration back from now (2h)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _export(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.cli.common import print_json, run_async
    from workbench.served_dataset import export_dataset, format_of

    fmt = format_of(args.out, args.format)
    manifest = run_async(
        export_dataset(
            settings, args.out, fmt=fmt, since_ms=parse_time(args.since),
            until_ms=parse_time(args.until), versions=args.versions or None,
            progress=not args.no_progress,
        )
    )  # fmt: skip
    if args.json:
        print_json(manifest)
        return 0
    c = manifest["counts"]
    print(f"{manifest['rows']} samples ({manifest['impressions']} impressions, "
          f"{manifest['clicks']} clicks) -> {args.out} ({fmt}, sha256 {manifest['sha256'][:12]})")  # fmt: skip
    print(f"versions: {', '.join(f'{v} {n}' for v, n in manifest['versions'].items()) or 'none'}")
    print(f"skipped: {c['degraded']} degraded, {c['not_final']} without a final outcome yet, "
          f"{c['duplicate']} duplicates, {c['invalid']} invalid, {c['mismatched']} mismatched, "
          f"{c['filtered']} filtered out")  # fmt: skip
    return 0


def train_from_dataset(args: argparse.Namespace, settings: Settings) -> int:
    """``streamrank train --from-dataset PATH [--warm-start VERSION_OR_DIR]``."""
    from scoring.model.artifact import load_artifact
    from scoring.model.din import ModelSpec
    from scoring.training.from_dataset import (
        DatasetTrainConfig,
        export_from_dataset,
        train_from_samples,
    )
    from workbench.cli.common import print_json
    from workbench.served_dataset import dataset_info, read_samples

    info = dataset_info(args.from_dataset)
    samples = read_samples(args.from_dataset)
    warm = None
    if args.warm_start:
        warm = load_artifact(args.warm_start, artifacts_dir=settings.tools.artifacts_dir)
    cfg = DatasetTrainConfig(
        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
        valid_share=args.valid_share, threads=settings.scoring.torch_threads,
        encoding=args.encoding or (warm.encoding if warm else settings.embeddings.encoding),
        history_len=settings.features.sequence_length,
        bucket_s=(settings.features.counter_bucket_s, settings.features.counter_coarse_bucket_s),
        spec=ModelSpec(), negatives=args.keep_negatives or None,
    )  # fmt: skip
    result = train_from_samples(samples, cfg, warm=warm, progress=not args.no_progress)
    path = export_from_dataset(result, cfg, info, args.out or settings.tools.artifacts_dir)
    report: dict[str, Any] = {
        "version": path.name, "artifact": str(path), "data": info.to_json(),
        "warm_start": result.warm_version, **result.metrics,
    }  # fmt: skip
    if args.json:
        print_json(report)
        return 0
    m = result.metrics
    print(f"artifact {path} (version {path.name}), from {info.rows} samples "
          f"(sha256 {info.sha256[:12]}), warm start: {result.warm_version or 'none'}")  # fmt: skip
    for name, vals in (("trained", m["valid"]), ("warm start", m["valid_warm_start"])):
        if vals:
            print(f"validation ({vals.get('n', 0)} requests) {name}: auc {vals.get('auc')}  "
                  f"gauc {vals.get('gauc')}  hr@10 {vals.get('hr@10')}")  # fmt: skip
    return 0


def add_train_flags(train: Any) -> None:
    """The flags of ``train --from-dataset``."""
    train.add_argument("--from-dataset", type=Path, default=None, metavar="PATH",
                       help="train on samples exported by `streamrank dataset export` "
                       "(docs/loop.md); the other data flags are ignored")  # fmt: skip
    train.add_argument("--warm-start", default=None, metavar="VERSION_OR_DIR",
                       help="with --from-dataset: start from this artifact's weights and item "
                       "vectors (a version under artifacts_dir, or its directory)")  # fmt: skip
    train.add_argument("--keep-negatives", type=int, default=0, metavar="K",
                       help="with --from-dataset: train on K non-clicked items per clicked one "
                       "from each request (default 0: all; retrain uses "
                       "STREAMRANK_RETRAIN_NEGATIVES)")  # fmt: skip
    train.add_argument("--valid-share", type=float, default=0.2,
                       help="with --from-dataset: the last share of the requests by time held "
                       "out for validation")  # fmt: skip


def register(sub: Any) -> None:
    dataset = sub.add_parser("dataset", help="training data from what was served")
    kinds = dataset.add_subparsers(dest="dataset_command", metavar="COMMAND")
    kinds.required = True
    export = kinds.add_parser(
        "export", help="join the served log and the final outcomes into training samples"
    )
    export.add_argument("--out", type=Path, required=True,
                        help="the data file (.parquet or .jsonl); the manifest goes beside it")  # fmt: skip
    export.add_argument("--format", choices=("parquet", "jsonl"), default=None,
                        help="default: by the --out suffix")  # fmt: skip
    export.add_argument("--since", default=None,
                        help="served at or after: epoch ms, ISO 8601 time, or a duration back (2h)")  # fmt: skip
    export.add_argument("--until", default=None, help="served before (same forms as --since)")
    export.add_argument("--versions", nargs="+", default=None, metavar="VERSION",
                        help="only requests served by these versions")  # fmt: skip
    export.add_argument("--no-progress", action="store_true")
    export.add_argument("--json", action="store_true", help="print the manifest")
    export.set_defaults(func=_export)
