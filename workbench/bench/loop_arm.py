"""One arm of ``streamrank bench loop`` (:mod:`workbench.bench.loop`): its workers, its traffic
and, for the ``loop`` arm, a retrain cycle after every ``--every-days`` days with a rollout
driver moving each published candidate through its steps while the next days' traffic flows."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scoring.model.artifact import Artifact
from streamrank.settings import Settings
from workbench.bench.loop_sim import LoopPlan, say, unseen_scoring
from workbench.bench.loop_traffic import ArmTraffic


async def _reset_pointers(redis: Any, version: str) -> None:
    """Version 1 serves alone; no rollout, split or cycle of an earlier arm is left."""
    from scoring.model.registry import activate_version
    from scoring.model.versions import set_split
    from streamrank import keys

    await redis.delete(keys.rollout_state(), keys.rollout_history(), keys.rollout_lease(),
                       keys.retrain_cycles())  # fmt: skip
    await set_split(redis, None)
    await activate_version(redis, version)


class Looper:
    """The loop arm's cycles and the rollout driver of the last published candidate."""

    def __init__(self, *, settings: Settings, redis: Any, args: argparse.Namespace, work: Path):
        from workbench.retrain import CyclePlan, RolloutPlan

        self.settings = settings
        self.redis = redis
        self.plan = CyclePlan(
            rollout=RolloutPlan(
                steps=args.steps, hold_s=args.hold, min_outcomes=args.min_outcomes, guard=args.guard
            ),
            artifacts_dir=work / "artifacts",
        )
        self.cycles: list[dict[str, Any]] = []
        self._driver: asyncio.Task[Any] | None = None

    async def cycle(self, day: int) -> None:
        from prometheus_client import CollectorRegistry

        from scoring.rollout.driver import RolloutDriver
        from scoring.rollout.metrics import RolloutMetrics
        from workbench.retrain import run_cycle

        o = self.settings.outcomes
        await asyncio.sleep(o.window_s + o.close_delay_s + 1.5)  # the day's outcomes are final
        cycle = await run_cycle(self.settings, self.plan)
        say(f"day {day}: retrain {cycle.outcome} {cycle.candidate or ''}: {cycle.reason}")
        self.cycles.append({"day": day, "outcome": cycle.outcome, "reason": cycle.reason,
                            "candidate": cycle.candidate, "gate": dict(cycle.gate),
                            "rows": cycle.dataset.get("rows")})  # fmt: skip
        if cycle.outcome == "published" and (self._driver is None or self._driver.done()):
            driver = RolloutDriver(redis=self.redis, bucket_s=o.bucket_s, tick_s=0.5,
                                   metrics=RolloutMetrics(CollectorRegistry()))  # fmt: skip
            self._driver = asyncio.create_task(driver.run())

    async def finish(self) -> list[dict[str, Any]]:
        """Abort a rollout still running (the traffic ended) and say how each ended."""
        from scoring.rollout.driver import control
        from scoring.rollout.state import RolloutStore

        if self._driver is not None and not self._driver.done():
            await control(self.redis, "abort", by="bench loop (out of traffic)")
            await self._driver
        return [{k: h[k] for k in ("action", "share", "reason")}
                for h in await RolloutStore(redis=self.redis).history(200)]  # fmt: skip


async def _served_records(settings: Settings) -> list[Any]:
    """Every record of the arm's served log."""
    from workbench.served_dataset import read_to_end, topic_sizes

    got: list[Any] = []
    sizes = await topic_sizes(settings, [str(settings.topics.served_log)])
    await read_to_end(settings, sizes, sink=lambda _t, v: got.append(v) if v else None)
    return got


def _vocabulary(versions: Mapping[str, int], work: Path, v1: Artifact) -> dict[str, frozenset[str]]:
    from scoring.model.artifact import load_artifact

    out = {v1.version: frozenset(v1.item_ids)}
    for version in versions:
        if version not in out and (work / "artifacts" / version).is_dir():
            out[version] = frozenset(load_artifact(work / "artifacts" / version).item_ids)
    return out


async def run_arm(name: str, rs: Settings, *, ds: Any, plan: LoopPlan, v1: Artifact,
                  args: argparse.Namespace, run: str, work: Path) -> dict[str, Any]:  # fmt: skip
    """Both arms' common path; only ``loop`` retrains."""
    from streamrank.kafka.topics import create_topics
    from streamrank.redis.client import redis_client
    from workbench.devstack.pipeline import ensure_published
    from workbench.devstack.processes import WorkerProcess, start_worker

    redis = redis_client(rs.redis, timeout_s=10.0)
    workers: list[WorkerProcess] = []
    try:
        await ensure_published(redis, v1, encoding="int8", progress=False)
        await _reset_pointers(redis, v1.version)
        await create_topics(rs)
        for kind in ("features", "scoring", "outcomes"):
            workers.append(start_worker(kind, rs, log_path=work / "logs" / run / f"{kind}.log"))
        await asyncio.gather(*(asyncio.to_thread(w.wait_ready, 240) for w in workers))
        looper = Looper(settings=rs, redis=redis, args=args, work=work) if name == "loop" else None
        history = [(str(ds.user_ids[r]), ds.items[int(ds.item_index[r])],
                    ds.item_category(int(ds.item_index[r])), int(ds.ts[r]))
                   for r in plan.train_rows.tolist()]  # fmt: skip
        async with ArmTraffic(settings=rs, redis=redis, run=run, n_candidates=args.candidates,
                              seed=args.seed, categories=dict(plan.categories)) as traffic:  # fmt: skip
            say(f"{name}: {len(history)} history clicks")
            await traffic.seed_history(history, sorted(plan.known))
            for day, events in enumerate(plan.by_day()):
                await traffic.stream(events)
                if looper is not None and (day + 1) % args.every_days == 0 and day + 1 < plan.days:
                    await looper.cycle(day)
            rollouts = await looper.finish() if looper is not None else []
            o = rs.outcomes
            await asyncio.sleep(o.window_s + o.close_delay_s + 1.5)  # the last outcomes close
        served = await _served_records(rs)
        answered = traffic.answered
        vocabulary = _vocabulary(answered.versions, work, v1)
        say(f"{name}: {len(answered.hits)} answered, versions {answered.versions}")
        return {
            "hits": answered.hits,
            "unanswered": answered.unanswered,
            "degraded": answered.degraded,
            "requests_by_version": answered.versions,
            "unseen": unseen_scoring(served, vocabulary),
            "cycles": looper.cycles if looper is not None else [],
            "rollouts": rollouts,
        }
    finally:
        codes = await asyncio.gather(*(asyncio.to_thread(w.stop) for w in workers))
        if any(codes):
            say(f"{name}: worker exit codes {codes}; logs in {work / 'logs' / run}")
        await redis.aclose()
