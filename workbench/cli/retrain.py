"""``streamrank retrain``: one cycle of the learning loop (:mod:`workbench.retrain`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from streamrank.settings import Settings


def _retrain(args: argparse.Namespace, settings: Settings) -> int:
    from scoring.rollout.join import require_single_redis
    from workbench.cli.common import print_json, run_async
    from workbench.cli.rollout import parse_duration
    from workbench.retrain import CyclePlan, RolloutPlan, run_cycle

    require_single_redis(settings.redis)
    rollout = RolloutPlan(
        steps=args.steps,
        hold_s=parse_duration(args.hold),
        min_outcomes=args.min_outcomes,
        guard=args.guard,
    )
    plan = CyclePlan(
        rollout=rollout,
        artifacts_dir=Path(args.out or settings.tools.artifacts_dir),
        dataset_format=args.format,
        progress=not args.no_progress,
    )
    cycle = run_async(run_cycle(settings, plan))
    if args.json:
        from dataclasses import asdict

        print_json(asdict(cycle))
    else:
        print(f"retrain: {cycle.outcome} {cycle.candidate or '-'} (active {cycle.active or '-'})")
        print(f"  {cycle.reason}")
    rolling = cycle.outcome == "published" and cycle.active is not None
    waiting = cycle.outcome == "skipped" and cycle.candidate is not None  # a rollout is running
    if args.drive and (rolling or waiting):
        return _drive(args, settings)
    return {"published": 0, "skipped": 0, "refused": 3}.get(cycle.outcome, 1)


def _drive(args: argparse.Namespace, settings: Settings) -> int:
    """Drive the running rollout until it ends (the lease makes one driver act at a time)."""
    from scoring.rollout.driver import drive
    from streamrank.runtime.signals import run_until_signalled
    from workbench.cli.rollout import parse_duration

    final = run_until_signalled(drive(settings, tick_s=parse_duration(args.tick), metrics_port=0))
    if final is None:
        print("driver stopped; the rollout goes on where it is: `streamrank rollout drive`")
        return 130
    print(f"rollout of {final.new} over {final.old}: {final.status} ({final.reason})")
    return 0 if final.status == "promoted" else 2


def register(sub: Any) -> None:
    from scoring.rollout.guard import DEFAULT_GUARD

    p = sub.add_parser(
        "retrain",
        help="one learning-loop cycle: export the served log -> train (warm start) -> gate "
        "against the active version -> publish -> staged rollout",
    )
    p.add_argument("--out", type=Path, default=None,
                   help="artifacts directory (default: STREAMRANK_ARTIFACTS_DIR); it must hold "
                   "the active version's artifact")  # fmt: skip
    p.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl",
                   help="format of the exported dataset (default jsonl)")  # fmt: skip
    p.add_argument("--steps", default="5,20,50,100", help="rollout: percent of users per step")
    p.add_argument("--hold", default="10m", help="rollout: least time per step")
    p.add_argument("--min-outcomes", type=int, default=1000,
                   help="rollout: requests per version a step needs before the guard decides")  # fmt: skip
    p.add_argument("--guard", default=DEFAULT_GUARD, help="rollout: the guard's checks")
    p.add_argument("--drive", action="store_true",
                   help="then drive the rollout until it ends (also a running one the cycle "
                   "skipped for)")  # fmt: skip
    p.add_argument("--tick", default="5s", help="how often the driver's guard looks")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the cycle as JSON")
    p.set_defaults(func=_retrain)
