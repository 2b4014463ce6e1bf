"""``streamrank replay``: online = offline on an artifact's test users (:mod:`workbench.replay`;
with ``--cascade``, :mod:`workbench.cascade_replay`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from scoring.model.artifact import CANDIDATES_FILE, CASCADE_FILE, load_artifact
from streamrank.settings import Settings
from workbench.cli.common import print_json, run_async

TOLERANCE = 1e-5  # per candidate score
CASCADE_TOLERANCE = 1e-4  # per reply score (the cascade)


def _replay(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.devstack.cases import newest_artifact
    from workbench.devstack.pipeline import stack_or_private
    from workbench.replay import say

    path = Path(args.artifact) if args.artifact else newest_artifact(settings.tools.artifacts_dir)
    artifact = load_artifact(path, artifacts_dir=settings.tools.artifacts_dir)
    cases = _cases(artifact, args)
    say(f"artifact {artifact.path}: {len(cases)} test users{' (cascade)' if args.cascade else ''}")
    tolerance = args.tolerance
    if tolerance is None:
        tolerance = CASCADE_TOLERANCE if args.cascade else TOLERANCE
    run_dir = Path(settings.tools.run_dir).resolve() / "replay"
    with stack_or_private(settings, run_dir=run_dir, say=say) as (stack_settings, _private):
        report = run_async(
            _run(args)(
                stack_settings,
                artifact,
                cases,
                encoding=args.encoding,
                concurrency=args.concurrency,
                tolerance=tolerance,
                apply_timeout_s=args.apply_timeout,
                activate=args.activate,
                progress=not args.no_progress,
            )
        )
        report["stack"] = "private embedded" if _private is not None else "configured"
    if args.json:
        print_json(report)
    elif args.cascade:
        print(_cascade_summary(report))
    else:
        print(
            f"version {report['version']} ({report['encoding']}): {report['answered']}/"
            f"{report['requests']} answered, {report['degraded']} degraded; max |online - "
            f"offline| {report['max_abs_diff']:.2e} (p99 {report['p99_abs_diff']:.2e}); "
            f"auc offline {report['offline']['auc']} online {report['online']['auc']}, gauc "
            f"offline {report['offline']['gauc']} online {report['online']['gauc']}; "
            f"{'CONSISTENT' if report['consistent'] else 'NOT CONSISTENT'}"
        )
    return 0 if report["consistent"] else 1


def _cases(artifact: Any, args: argparse.Namespace) -> list[Any]:
    from workbench.devstack.cascadecases import load_cascade_cases
    from workbench.devstack.cases import load_cases

    if args.cascade:
        return load_cascade_cases(artifact.path / CASCADE_FILE, limit=args.users)
    return load_cases(artifact.path / CANDIDATES_FILE, limit=args.users)


def _run(args: argparse.Namespace) -> Any:
    if args.cascade:
        from workbench.cascade_replay import run_cascade_replay

        return run_cascade_replay
    from workbench.replay import run_replay

    return run_replay


def _cascade_summary(report: dict[str, Any]) -> str:
    hr = next(k for k in report if k.startswith("hr@"))
    diff = report["max_abs_diff"]
    lines = [
        f"version {report['version']} ({report['encoding']}), cascade {report['cascade']}",
        f"{report['answered']}/{report['requests']} answered, {report['degraded']} degraded, "
        f"{report['cached']} cached; same top-{report['cascade']['top_k']} as offline: "
        f"{report['same_items']}/{report['users']} (same set {report['same_set']}); max |online "
        f"- offline| {'n/a' if diff is None else f'{diff:.2e}'} (tolerance "
        f"{report['tolerance']:.0e}); {hr} offline {report[hr]['offline']} online "
        f"{report[hr]['online']} (fp32 {report[hr]['offline_fp32']})",
        f"offline on the fp32 table: {report['offline_fp32_vs_artifact']['same_items']}/"
        f"{report['users']} lists as the artifact's file; as the {report['encoding']} table's: "
        f"{report['offline_vs_offline_fp32']['same_items']}/{report['users']}",
    ]
    for m in report["mismatches"]:
        lines.append(f"  user {m['user_id']}: offline {m['offline']} online {m['online']}")
    lines.append("CONSISTENT" if report["consistent"] else "NOT CONSISTENT")
    return "\n".join(lines)


def register(sub: Any) -> None:
    replay = sub.add_parser(
        "replay",
        help="online/offline consistency: replay an artifact's test users through Kafka and "
        "compare the served scores with the offline ones",
    )
    replay.add_argument("--artifact", default=None,
                        help="artifact DIR/<version> (default: the newest under artifacts_dir)")  # fmt: skip
    replay.add_argument("--users", type=int, default=None, help="replay only the first N users")
    replay.add_argument("--encoding", default=None,
                        help="publish with this encoding when the version is not published yet "
                        "(default: the artifact's)")  # fmt: skip
    replay.add_argument("--concurrency", type=int, default=32, help="rank requests in flight")
    replay.add_argument("--cascade", action="store_true",
                        help="one retrieval request per test user (cascade_test.jsonl): the "
                        "online cascade's top-k must equal the offline cascade's")  # fmt: skip
    replay.add_argument("--tolerance", type=float, default=None,
                        help=f"largest |online - offline| accepted per score (default "
                        f"{TOLERANCE:g}; {CASCADE_TOLERANCE:g} with --cascade)")  # fmt: skip
    replay.add_argument("--apply-timeout", type=float, default=300.0,
                        help="seconds to wait for the features worker to apply every click")  # fmt: skip
    replay.add_argument("--activate", action="store_true",
                        help="also make the version the serving one (sr:model:active); the "
                        "replay itself pins its worker to the version and does not need it")  # fmt: skip
    replay.add_argument("--no-progress", action="store_true")
    replay.add_argument("--json", action="store_true", help="print the report as JSON")
    replay.set_defaults(func=_replay)
