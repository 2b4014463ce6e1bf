"""``streamrank train``, ``streamrank publish ARTIFACT`` and ``streamrank activate VERSION``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from streamrank.settings import Settings


def _train_command(args: argparse.Namespace, settings: Settings) -> int:
    """``train`` on MovieLens or synthetic data, or ``--from-dataset`` (served samples)."""
    if args.from_dataset is not None:
        from workbench.cli.dataset import train_from_dataset

        return train_from_dataset(args, settings)
    if args.warm_start is not None:
        raise SystemExit("streamrank train: --warm-start needs --from-dataset PATH")
    return _train(args, settings)


def _train(args: argparse.Namespace, settings: Settings) -> int:
    from scoring.model.features import parse_families
    from scoring.training.data import load_movielens
    from scoring.training.export import export_artifact
    from scoring.training.negatives import NegativeMix
    from scoring.training.train import TrainConfig, train_and_evaluate
    from workbench.datasets import movielens_dir

    if args.synthetic:
        from scoring.training.synthetic import generate

        ds = generate(n_users=args.users, n_items=args.items, seed=args.seed)
    else:
        ds = load_movielens(args.data or movielens_dir(settings.tools))
    cfg = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        history_len=settings.features.sequence_length,
        n_negatives=args.negatives,
        threads=settings.scoring.torch_threads,
        families=parse_families(args.features),
        bucket_s=(settings.features.counter_bucket_s, settings.features.counter_coarse_bucket_s),
        patience=args.patience,
        time_split=not args.no_time_split,
        train_negatives=NegativeMix.parse(args.train_negatives),
        retrieval=None if args.no_retrieval else retrieval_config(args, settings),
    )
    result = train_and_evaluate(ds, cfg, progress=not args.no_progress)
    out = args.out or settings.tools.artifacts_dir
    path = export_artifact(
        result, ds, cfg, out, encoding=args.encoding or settings.embeddings.encoding
    )
    m = result.metrics
    report: dict[str, Any] = {
        "version": path.name,
        "artifact": str(path),
        "data": {
            "name": ds.name,
            "sha256": ds.sha256,
            "events": ds.n_events,
            "items": len(ds.items),
        },
        "test": m["test"],
        "selected": m["selected"],
        "auc_by_encoding": m["auc_by_encoding"],
        "goals": m["goals"],
        "serving_vs_forward_max_abs_diff": m["serving_vs_forward_max_abs_diff"],
        "samples": m["samples"],
        "time_split": m["time_split"],
        "full_ranking": m["full_ranking"],
        "best_epoch": {k: v["best_epoch"] for k, v in m["training"].items()},
        "train": cfg.to_json(),
        "train_seconds": m["train_seconds"],
        "eval_seconds": m["eval_seconds"],
    }
    if args.json:
        from workbench.cli.common import print_json

        print_json(report)
        return 0
    print(f"artifact {path} (version {path.name})")
    split = m["time_split"] or {}
    timed = split.get("test", {})
    print(f"{'':<12}{'leave-last-out':>18}" + (f"{'time split':>18}" if timed else ""))
    print(f"{'model':<12}" + f"{'auc':>9}{'gauc':>9}" * (2 if timed else 1))
    for name, vals in m["test"].items():
        extra = f"{timed[name]['auc']:>9.4f}{timed[name]['gauc']:>9.4f}" if timed else ""
        print(f"{name:<12}{vals['auc']:>9.4f}{vals['gauc']:>9.4f}{extra}")
    if split and "not_run" in split:
        print(f"time split not run: {split['not_run']} ({split['counts']})")
    print(
        "din auc by encoding: " + ", ".join(f"{k} {v:.4f}" for k, v in m["auc_by_encoding"].items())
    )
    _print_full_ranking(m["full_ranking"])
    print("goals: " + ", ".join(f"{k}={v}" for k, v in m["goals"].items()))
    return 0


def _print_full_ranking(full: dict[str, Any]) -> None:
    """HR@10 / NDCG@10 / recall@200 over all items, one line per method and protocol."""
    for protocol, report in full.items():
        if not report:
            continue
        print(f"full ranking, {protocol} ({report['users']} users, {report['items']} items):")
        for method, vals in report.items():
            if isinstance(vals, dict) and "hr@10" in vals:
                print(f"  {method:<12}hr@10 {vals['hr@10']:.4f}  ndcg@10 {vals['ndcg@10']:.4f}  "
                      f"recall@200 {vals['recall@200']:.4f}  ({vals['seconds']} s)")  # fmt: skip


def retrieval_config(args: argparse.Namespace, settings: Settings) -> Any:
    """The two-tower model, its index and the offline cascade, from the flags and settings."""
    from scoring.model.ann import IndexOptions
    from scoring.model.retrieval import RetrievalSpec
    from scoring.training.twotower import RetrievalConfig

    return RetrievalConfig(
        spec=RetrievalSpec(dim=args.retrieval_dim, history_len=settings.features.sequence_length),
        index=IndexOptions(kind=args.index),
        cascade=cascade_config(settings),
    )


def cascade_config(settings: Settings) -> Any:
    """The offline cascade with the serving widths and the default scene's rule."""
    from scoring.model.cascade import Widths
    from scoring.training.cascade_eval import CascadeConfig

    c = settings.cascade
    rule = c.rule("default")
    return CascadeConfig(
        widths=Widths(retrieve=c.retrieve, coarse=c.coarse, rerank=c.rerank_window),
        top_k=rule.top_k or c.top_k,
        filter_seen=rule.filter_seen,
        category_cap=rule.category_cap,
    )


async def _redis(settings: Settings) -> Any:
    from streamrank.redis.client import redis_client

    return redis_client(settings.redis)


def _publish(args: argparse.Namespace, settings: Settings) -> int:
    from scoring.embeddings.codec import ENCODINGS
    from scoring.model.artifact import load_artifact
    from scoring.model.registry import publish_artifact
    from streamrank.errors import ArtifactError
    from workbench.cli.common import print_json, run_async

    if args.encoding is not None and args.encoding not in ENCODINGS:
        raise ArtifactError(
            f"unknown encoding {args.encoding!r}; use one of {', '.join(ENCODINGS)}"
        )
    artifact = load_artifact(
        args.artifact, artifacts_dir=settings.tools.artifacts_dir
    )  # validates all

    async def go() -> dict[str, Any]:
        redis = await _redis(settings)
        try:
            return await publish_artifact(
                redis, artifact, encoding=args.encoding, progress=not args.no_progress
            )
        finally:
            await redis.aclose()

    report = run_async(go())
    if args.json:
        print_json(report)
    else:
        print(f"published {report['version']} ({report['item_table']['rows']} items, {report['encoding']}); "
              f"activate it with: streamrank activate {report['version']}")  # fmt: skip
    return 0


def _activate(args: argparse.Namespace, settings: Settings) -> int:
    from scoring.model.registry import activate_version
    from workbench.cli.common import print_json, run_async

    async def go() -> str | None:
        redis = await _redis(settings)
        try:
            return await activate_version(redis, args.version, features=settings.features)
        finally:
            await redis.aclose()

    previous = run_async(go())
    if args.json:
        print_json({"active": args.version, "previous": previous})
    else:
        print(f"active model: {args.version} (was {previous or 'none'})")
    return 0


def register(sub: Any) -> None:
    from scoring.embeddings.codec import ENCODINGS
    from scoring.model.ann import INDEX_KINDS
    from scoring.model.features import FAMILIES
    from workbench.cli.dataset import add_train_flags

    train = sub.add_parser(
        "train", help="train DIN + baselines, evaluate, write a versioned artifact"
    )
    train.add_argument("--data", type=Path, default=None,
                       help="the ml-100k folder (RecBole or GroupLens files; default: data_dir/ml-100k, "
                       "else data_cache_dir/ml-100k)")  # fmt: skip
    train.add_argument(
        "--synthetic", action="store_true", help="train on synthetic planted-interest data"
    )
    train.add_argument("--users", type=int, default=2000, help="synthetic: number of users")
    train.add_argument(
        "--items", type=int, default=2_000_000, help="synthetic: size of the item id space"
    )
    train.add_argument(
        "--out", type=Path, default=None, help="artifacts root (default: settings artifacts_dir)"
    )
    train.add_argument("--epochs", type=int, default=3)
    train.add_argument("--batch-size", type=int, default=256)
    train.add_argument("--lr", type=float, default=2e-3)
    train.add_argument("--seed", type=int, default=17)
    train.add_argument("--negatives", type=int, default=20, help="sampled negatives per test user")
    train.add_argument("--train-negatives", default="uniform:1", metavar="MIX",
                       help="negatives per train positive by source: uniform, popularity "
                       "(count^0.75 as of the sample), hard (the retriever's top 200), "
                       "e.g. uniform:1,popularity:3 (docs/cascade.md)")  # fmt: skip
    train.add_argument("--patience", type=int, default=None,
                       help="stop a model after this many epochs without a better validation GAUC")  # fmt: skip
    train.add_argument("--no-time-split", action="store_true",
                       help="evaluate leave-last-out only (skips the second fit)")  # fmt: skip
    train.add_argument(
        "--features",
        default=",".join(FAMILIES),
        help="feature families of the featured models, comma-separated (default: all of "
        f"{','.join(FAMILIES)}); DIN on the sequence alone is trained beside them and the "
        "better on validation GAUC becomes the version",
    )
    train.add_argument(
        "--encoding",
        default=None,
        choices=ENCODINGS,
        help="default encoding recorded in config.json (default: setting embedding_encoding)",
    )
    train.add_argument(
        "--threads", type=int, default=None, help="torch threads (setting torch_threads)"
    )
    train.add_argument("--no-retrieval", action="store_true",
                       help="skip the two-tower retrieval model, its index and the full-ranking figures")  # fmt: skip
    train.add_argument("--retrieval-dim", type=int, default=32,
                       help="dimension of the retrieval vectors")  # fmt: skip
    train.add_argument("--index", default="auto", choices=INDEX_KINDS,
                       help="ANN index kind (auto: exact up to 200,000 items, else HNSW)")  # fmt: skip
    add_train_flags(train)
    train.add_argument("--no-progress", action="store_true")
    train.add_argument("--json", action="store_true", help="print one JSON object")
    train.set_defaults(func=_train_command, setting_flags={"threads": "STREAMRANK_TORCH_THREADS"})

    pub = sub.add_parser(
        "publish", help="publish an artifact's item table, weights and config to Redis"
    )
    pub.add_argument(
        "artifact", help="artifact directory DIR/<version> (or a version under artifacts_dir)"
    )
    pub.add_argument(
        "--encoding", default=None, help="fp32, fp16 or int8 (default: the artifact's)"
    )
    pub.add_argument("--no-progress", action="store_true")
    pub.add_argument("--json", action="store_true")
    pub.set_defaults(func=_publish)

    act = sub.add_parser("activate", help="make a published version the serving version")
    act.add_argument("version")
    act.add_argument("--json", action="store_true")
    act.set_defaults(func=_activate)
