"""``streamrank bench loop``: does the learning loop pay? MovieLens-100K in time order, through
real features, scoring and outcomes workers on a private embedded stack.

The first ``--split`` of the log (by time) trains version 1. The rest is streamed day by day
as clicks, a drawn share of them preceded by a ranking request for the user whose candidates
are the clicked item and ``--candidates - 1`` others that exist by then; items version 1 never
saw are announced on the items topic just before they first appear. Two arms see exactly the
same traffic, each on its own topics and users: ``frozen`` keeps version 1; ``loop`` runs
``streamrank retrain`` (export -> train warm-started -> gate -> publish -> staged rollout,
driven by online evidence) after every ``--every-days`` simulated days. Reported per period:
both arms' online HR@10 (the clicked item in the top 10 of its request), the later-half gain
(``loop_minus_frozen_hr10``) and how requests with an item unknown to their version were
scored (``new_items_cold_start_share``: by its attributes, not the OOV row).
"""

from __future__ import annotations

import argparse
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from streamrank.settings import Settings
from workbench.bench.loop_sim import (
    LoopPlan,
    later_half_gain,
    period_figures,
    periods,
    plan_loop,
    say,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split", type=float, default=0.7,
                        help="share of the log (time order) that trains version 1")  # fmt: skip
    parser.add_argument("--days", type=int, default=None,
                        help="simulated days streamed after the split (default: all)")  # fmt: skip
    parser.add_argument("--request-share", type=float, default=0.3,
                        help="share of the streamed clicks preceded by a ranking request")  # fmt: skip
    parser.add_argument("--candidates", type=int, default=100, help="items per request")
    parser.add_argument("--periods", type=int, default=4, help="periods the report is cut into")
    parser.add_argument("--every-days", type=int, default=3, help="days between retrains")
    parser.add_argument("--epochs", type=int, default=3, help="version 1's training epochs")
    parser.add_argument("--retrain-epochs", type=int, default=1, help="epochs per retrain")
    parser.add_argument("--steps", default="50,100", help="each retrain's rollout steps (%%)")
    parser.add_argument("--hold", type=float, default=1.0, help="least seconds per rollout step")
    parser.add_argument("--min-outcomes", type=int, default=20,
                        help="requests per version a rollout step needs before the guard decides")  # fmt: skip
    parser.add_argument("--guard", default="auc:0.02,degraded:5%",
                        help="the rollouts' guard checks")  # fmt: skip
    parser.add_argument("--artifact", default=None,
                        help="version 1 (an artifact trained on the same split; default: train "
                        "it here)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--quick", action="store_true",
                        help="4 days, 20%% requests, 2 epochs: a smoke run in a few minutes")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true")


def train_version_one(ds: Any, plan: LoopPlan, args: argparse.Namespace, settings: Settings,
                      out: Path) -> Path:  # fmt: skip
    """DIN on the training part only (sequence features: the loop's clicks carry wall-clock
    times, so time windows would not mean what they meant offline)."""
    from scoring.training.data import subset
    from scoring.training.export import export_artifact
    from scoring.training.train import TrainConfig, train_and_evaluate

    part = subset(ds, plan.train_rows, name=f"{ds.name}-first-{args.split:g}")
    cfg = TrainConfig(epochs=args.epochs, seed=args.seed, families=("sequence",),
                      history_len=settings.features.sequence_length, time_split=False,
                      retrieval=None, threads=settings.scoring.torch_threads)  # fmt: skip
    say(f"training version 1 on {part.n_events} clicks ({len(part.items)} items)")
    result = train_and_evaluate(part, cfg, progress=not args.no_progress)
    return Path(export_artifact(result, part, cfg, out, encoding="int8"))


def arm_settings(settings: Settings, *, run: str, work: Path, args: argparse.Namespace) -> Settings:
    """Private topics and groups, outcomes closed quickly, retrain cycles on the bench's data."""
    from workbench.devstack.cases import private_run

    return settings.with_env(
        **private_run(run),
        STREAMRANK_ITEMS_TOPIC=f"{run}-items",
        STREAMRANK_SERVED_LOG_TOPIC=f"{run}-served",
        STREAMRANK_OUTCOMES_TOPIC=f"{run}-outcomes",
        STREAMRANK_OUTCOMES_GROUP_ID=f"{run}-outcomes",
        STREAMRANK_SCORING_POLL_S=0.2,
        STREAMRANK_CANARY_SPLIT=None,
        STREAMRANK_OUTCOME_BUCKET_S=1,
        STREAMRANK_OUTCOME_WINDOW_S=5,
        STREAMRANK_OUTCOME_CLOSE_DELAY_S=2,
        STREAMRANK_OUTCOMES_EXPORT_INTERVAL_S=0,
        STREAMRANK_ARTIFACTS_DIR=str(work / "artifacts"),
        STREAMRANK_RETRAIN_DATASET_DIR=str(work / "datasets" / run),
        STREAMRANK_RETRAIN_EPOCHS=args.retrain_epochs,
        STREAMRANK_RETRAIN_GATE_MIN_SAMPLES=20,
        STREAMRANK_RETRAIN_LOOKBACK_H=10_000,
    )


async def _bench(settings: Settings, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from scoring.model.artifact import load_artifact
    from scoring.training.data import load_movielens
    from workbench.bench.loop_arm import run_arm
    from workbench.datasets import movielens_dir

    started = time.perf_counter()
    ds = load_movielens(movielens_dir(settings.tools))
    plan = plan_loop(ds, split=args.split, days=args.days, request_share=args.request_share,
                     seed=args.seed)  # fmt: skip
    source = Path(args.artifact) if args.artifact else train_version_one(
        ds, plan, args, settings, work / "v1")  # fmt: skip
    v1 = load_artifact(source)
    shutil.copytree(v1.path, work / "artifacts" / v1.version, dirs_exist_ok=True)
    unknown = set(plan.known) - set(v1.item_ids)
    if unknown:
        raise ValueError(f"--artifact {source} does not know {len(unknown)} items of the training "
                         "part: train it on the same --split")  # fmt: skip
    say(f"{len(plan.events)} clicks over {plan.days} days after the split, "
        f"{sum(e.request for e in plan.events)} requests, {len(plan.new_items())} new items")  # fmt: skip
    spans = periods(plan.days, args.periods)
    arms: dict[str, Any] = {}
    for name in ("frozen", "loop"):
        run = f"loop-{name}-{uuid.uuid4().hex[:6]}"
        rs = arm_settings(settings, run=run, work=work, args=args)
        arms[name] = await run_arm(name, rs, ds=ds, plan=plan, v1=v1, args=args, run=run,
                                   work=work)  # fmt: skip
        arms[name]["periods"] = period_figures(arms[name].pop("hits"), spans)
    return {
        "periods": [
            {
                **{k: f[k] for k in ("period", "days", "requests")},
                "frozen_hr@10": f["hr@10"],
                "loop_hr@10": g["hr@10"],
            }
            for f, g in zip(arms["frozen"]["periods"], arms["loop"]["periods"], strict=True)
        ],
        "loop_minus_frozen_hr10": later_half_gain(
            arms["loop"]["periods"], arms["frozen"]["periods"]
        ),
        "new_items_cold_start_share": {n: a["unseen"]["cold_start_share"] for n, a in arms.items()},
        "requests_with_unseen_item_share": {
            n: a["unseen"]["with_unseen_item_share"] for n, a in arms.items()
        },
        "arms": arms,
        "version_1": {
            "version": v1.version,
            "items": len(v1.item_ids),
            "train_events": len(plan.train_rows),
        },
        "config": {
            k: getattr(args, k)
            for k in (
                "split",
                "days",
                "request_share",
                "candidates",
                "every_days",
                "epochs",
                "retrain_epochs",
                "steps",
                "hold",
                "min_outcomes",
                "guard",
                "seed",
            )
        },
        "plan": {
            "days": plan.days,
            "clicks": len(plan.events),
            "requests": sum(e.request for e in plan.events),
            "new_items": len(plan.new_items()),
        },
        "seconds_total": round(time.perf_counter() - started, 1),
    }


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from workbench.bench.private_stack import on_private_stack, work_dir

    if args.quick:
        args.days = args.days or 4
        args.request_share, args.epochs = 0.2, min(args.epochs, 2)
    work = work_dir(settings, "loop")
    return on_private_stack(settings, work, lambda s: _bench(s, args, work), name="loop")
