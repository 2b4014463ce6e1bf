"""``streamrank bench rollout``: staged rollouts on real data, decided by online evidence.

On MovieLens-100K test users (an artifact's ``test_candidates.jsonl``), through Kafka and a
features, a scoring and an outcomes worker: each round replays every test user's history as
clicks (user ids prefixed per round, so every round is a fresh set of users that the stable
canary hash splits anew), sends one ranking request per user with its 21 candidates, and, after
the reply, the user's held-out positive as a click. Meanwhile a rollout driver moves the split
through the steps and decides from the online metrics.

Scenarios, in order:

1. ``bad``: the good version A is active, a bad version (A with its item rows shuffled) rolls
   out; the guard must roll it back (``seconds_to_rollback`` from the start of the rollout).
2. ``good``: the bad version is active (a mistake to fix), A rolls out; the guard must promote
   it.
3. ``equal``: A is active and an equally good version B (another training seed; default: A's
   weights under another name) rolls out, ``--equal-runs`` times with different user prefixes
   (seeds); every rollback is a false one.

Online AUC per version is measured over every request it served in the benchmark and set
against the offline AUC of the same version on the same test users (int8 table, as served).
Runs on a private embedded stack (a rollout moves the serving pointers, which must never
happen on a stack others use), unless ``--use-stack``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from streamrank.settings import Settings
from workbench.bench.rollout_sim import say
from workbench.bench.rollout_traffic import Traffic

if TYPE_CHECKING:
    from workbench.devstack.processes import WorkerProcess

# Latency as `slower` (new against old in the same window), not an absolute budget: the bursts of
# this benchmark on a shared machine push every version's p99 to seconds (docs/rollout.md).
DEFAULT_GUARD = "auc:0.005,slower:250ms,degraded:1%"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--artifact", default=None,
                        help="the good version A (default: the newest artifact under "
                        "artifacts_dir)")  # fmt: skip
    parser.add_argument("--equal-artifact", default=None,
                        help="an equally good version B (e.g. another --seed of train); "
                        "default: A's weights published under another name")  # fmt: skip
    parser.add_argument("--users", type=int, default=None, help="test users per round (all)")
    parser.add_argument("--steps", default="5,20,50,100")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds per step at least")
    parser.add_argument("--min-outcomes", type=int, default=100)
    parser.add_argument("--guard", default=DEFAULT_GUARD)
    parser.add_argument("--tick", type=float, default=0.5, help="driver tick, seconds")
    parser.add_argument("--equal-runs", type=int, default=5)
    parser.add_argument("--simulated-runs", type=int, default=200,
                        help="rollouts replayed offline through the same guard code (no Kafka) "
                        "to measure how often it fires falsely")  # fmt: skip
    parser.add_argument("--max-rounds", type=int, default=12,
                        help="rounds of traffic before a rollout that has not ended is "
                        "aborted")  # fmt: skip
    parser.add_argument("--chunk", type=int, default=200, help="users per traffic chunk")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--bucket", type=int, default=1, help="statistics bucket, seconds")
    parser.add_argument("--use-stack", action="store_true",
                        help="run on the configured stack (moves its serving pointers!)")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true")


def shuffled_version(artifact: Any, out_dir: Path, *, seed: int = 1) -> Path:
    """A deliberately bad version: ``artifact`` with its item rows shuffled (every item gets
    another item's vector), published under ``<version>-shuffled``."""
    from scoring.model.artifact import derive_artifact

    rng = np.random.default_rng(seed)
    table = artifact.item_table[rng.permutation(len(artifact.item_table))]
    return Path(
        derive_artifact(
            artifact,
            out_dir,
            version=f"{artifact.version}-shuffled",
            item_table=table,
            note=f"item rows shuffled (seed {seed})",
        )
    )


def renamed_version(artifact: Any, out_dir: Path) -> Path:
    """The same model under another version name (an exactly equal version)."""
    from scoring.model.artifact import derive_artifact

    return Path(
        derive_artifact(
            artifact,
            out_dir,
            version=f"{artifact.version}-twin",
            item_table=artifact.item_table,
            note="identical copy",
        )
    )


def workers_settings(settings: Settings, *, run: str, bucket_s: int) -> Settings:
    """Private topics and groups; pointers followed quickly; statistics in fine buckets."""
    from workbench.devstack.cases import private_run

    return settings.with_env(
        **private_run(run),
        STREAMRANK_SERVED_LOG_TOPIC=f"{run}-served",
        STREAMRANK_OUTCOMES_TOPIC=f"{run}-outcomes",
        STREAMRANK_OUTCOMES_GROUP_ID=f"{run}-outcomes",
        STREAMRANK_SCORING_POLL_S=0.2,
        STREAMRANK_CANARY_SPLIT=None,
        STREAMRANK_OUTCOME_BUCKET_S=bucket_s,
        STREAMRANK_OUTCOME_WINDOW_S=120,
        STREAMRANK_OUTCOME_CLOSE_DELAY_S=5,
        # the bench reads Redis itself; the gauges' export over 1 s buckets (3,600 hashes per
        # version for the 1 h window) would load Redis and the CPU it measures on
        STREAMRANK_OUTCOMES_EXPORT_INTERVAL_S=0,
    )


async def _set_serving(redis: Any, active: str) -> None:
    from scoring.model.registry import activate_version
    from scoring.model.versions import set_split

    await set_split(redis, None)
    await activate_version(redis, active)


async def _restore_pointers(redis: Any, saved: Sequence[Any]) -> None:
    from streamrank import keys

    for key, value in zip((keys.active_model(), keys.model_split()), saved, strict=True):
        if value is None:
            await redis.delete(key)
        else:
            await redis.set(key, value)


async def run_rollout(
    *, redis: Any, traffic: Traffic, old: str, new: str, args: argparse.Namespace, prefix: str,
    bucket_s: int,
) -> dict[str, Any]:  # fmt: skip
    """One rollout of ``new`` over ``old`` while traffic flows; returns how it ended."""
    from prometheus_client import CollectorRegistry

    from scoring.rollout.driver import RolloutDriver, control, start_rollout
    from scoring.rollout.metrics import RolloutMetrics
    from scoring.rollout.state import RolloutStore

    await _set_serving(redis, old)
    await asyncio.sleep(bucket_s + 0.5)  # statistics buckets of an earlier run stay behind
    state = await start_rollout(
        redis, new=new, steps=args.steps, hold_s=args.hold, min_outcomes=args.min_outcomes,
        guard=args.guard, by="bench",
    )  # fmt: skip
    driver = RolloutDriver(
        redis=redis, bucket_s=bucket_s, tick_s=args.tick,
        metrics=RolloutMetrics(CollectorRegistry()),
    )  # fmt: skip
    task = asyncio.create_task(driver.run())
    rounds = 0
    while not task.done() and rounds < args.max_rounds:
        await traffic.round(f"{prefix}r{rounds}", until=task)
        rounds += 1
    if not task.done():
        await control(redis, "abort", by="bench (out of traffic rounds)")
    final = await task
    assert final is not None
    history = await RolloutStore(redis=redis).history(50)
    checks = []
    if driver.last is not None:
        checks = [
            {"metric": r.check.metric, "status": r.status, **r.estimate.to_json()}
            for r in driver.last.results
        ]
    say(f"{new} over {old}: {final.status} after {(final.updated_ms - state.started_ms) / 1000:.1f}s "
        f"({rounds} rounds): {final.reason}")  # fmt: skip
    return {
        "status": final.status,
        "seconds": round((final.updated_ms - state.started_ms) / 1000, 2),
        "rounds": rounds,
        "reason": final.reason,
        "last_checks": checks,
        "history": [
            {k: h[k] for k in ("action", "share", "reason")}
            | {"at_s": round((h["at_ms"] - state.started_ms) / 1000, 2)}
            for h in history
        ],
    }


def _auc_entry(summary: Any, offline: float) -> dict[str, Any]:
    online = summary.auc.to_json()
    lo, hi = summary.auc.lo, summary.auc.hi
    return {
        "online_auc": online,
        "offline_auc": round(offline, 6),
        "offline_within_online_interval": bool(
            lo is not None and hi is not None and lo <= offline <= hi
        ),
        "online_requests": summary.requests,
    }


@dataclass(frozen=True)
class Versions:
    """The benchmark's versions: the good A, the bad (A shuffled), and the equal B."""

    good: Any
    bad: Any
    equal: Any

    def all(self) -> tuple[Any, Any, Any]:
        return self.good, self.bad, self.equal


def load_versions(settings: Settings, args: argparse.Namespace, work: Path) -> Versions:
    from scoring.model.artifact import load_artifact
    from workbench.devstack.cases import newest_artifact

    good = load_artifact(
        Path(args.artifact) if args.artifact else newest_artifact(settings.tools.artifacts_dir)
    )
    bad = load_artifact(shuffled_version(good, work / "artifacts"))
    equal = load_artifact(
        Path(args.equal_artifact)
        if args.equal_artifact
        else renamed_version(good, work / "artifacts")
    )
    return Versions(good, bad, equal)


async def _bench(settings: Settings, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from scoring.model.artifact import CANDIDATES_FILE
    from streamrank import keys
    from streamrank.redis.client import redis_client
    from workbench.bench.rollout_sim import simulations
    from workbench.devstack.cases import load_cases, offline_scores, quality

    started = time.perf_counter()
    versions = load_versions(settings, args, work)
    good, bad, equal = versions.all()
    cases = load_cases(good.path / CANDIDATES_FILE, limit=args.users)
    run = f"rollout-{uuid.uuid4().hex[:6]}"
    rs = workers_settings(settings, run=run, bucket_s=args.bucket)
    history_len = int(good.config.get("train", {}).get("history_len", rs.features.sequence_length))
    rs = rs.with_env(STREAMRANK_SEQUENCE_LENGTH=history_len)
    labels = np.array([c.labels for c in cases])
    scores = {
        a.version: offline_scores(a, cases, encoding="int8", max_history=history_len)
        for a in versions.all()
    }
    offline = {v: quality(labels, x) for v, x in scores.items()}
    say(f"{len(cases)} test users per round; offline AUC {offline}")
    redis = redis_client(rs.redis, timeout_s=10.0)
    workers: list[WorkerProcess] = []
    before = await redis.mget([keys.active_model(), keys.model_split()])
    try:
        await _start_stack(redis, rs, versions, work / "logs", workers)
        report = await _scenarios(redis, rs, cases, args, run=run, versions=versions,
                                  offline=offline)  # fmt: skip
    finally:
        codes = await asyncio.gather(*(asyncio.to_thread(w.stop) for w in workers))
        if any(codes):
            say(f"worker exit codes {codes}; logs in {work / 'logs'}")
        await _restore_pointers(redis, before)  # a configured stack serves as it did
        await redis.aclose()
    report["simulated"] = simulations(args, cases, scores, good, bad, equal)
    report["config"] = {
        "users_per_round": len(cases),
        "candidates_per_user": len(cases[0].items),
        "steps": args.steps,
        "hold_s": args.hold,
        "min_outcomes": args.min_outcomes,
        "guard": args.guard,
        "tick_s": args.tick,
        "bucket_s": args.bucket,
        "confidence": 0.95,
    }
    report["offline"] = offline
    report["seconds_total"] = round(time.perf_counter() - started, 1)
    return report


async def _start_stack(
    redis: Any, rs: Settings, versions: Versions, logs: Path, workers: list[WorkerProcess]
) -> None:
    """Every version published, the good one served, the topics made and the features,
    scoring and outcomes workers started (into ``workers``, for the caller to stop) and ready."""
    from streamrank.kafka.topics import create_topics
    from workbench.devstack.pipeline import ensure_published
    from workbench.devstack.processes import start_worker

    for artifact in versions.all():
        await ensure_published(redis, artifact, encoding="int8", progress=False)
    await _set_serving(redis, versions.good.version)
    await create_topics(rs)  # the served log and outcomes topics too
    for kind in ("features", "scoring", "outcomes"):
        workers.append(start_worker(kind, rs, log_path=logs / f"{kind}.log"))
    say(f"waiting for the workers (logs in {logs})")
    await asyncio.gather(*(asyncio.to_thread(w.wait_ready, 240) for w in workers))


async def _scenarios(
    redis: Any, rs: Settings, cases: Sequence[Any], args: argparse.Namespace, *, run: str,
    versions: Versions, offline: dict[str, dict[str, float]],
) -> dict[str, Any]:  # fmt: skip
    """The three scenarios in order, with the traffic that flowed through them."""
    from streamrank import clock

    bench_start = clock.now_ms()
    report: dict[str, Any] = {}
    async with Traffic(
        settings=rs, redis=redis, cases=cases, chunk=args.chunk,
        concurrency=args.concurrency, progress=not args.no_progress,
    ) as traffic:  # fmt: skip
        scenario = Scenario(redis=redis, traffic=traffic, args=args, run=run, versions=versions,
                            offline=offline)  # fmt: skip
        report.update(await scenario.bad_then_good(since_ms=bench_start))
        report["equal"] = await scenario.equal()
        report["traffic"] = {
            "requests": traffic.requests,
            "degraded": traffic.degraded,
            "unanswered": traffic.unanswered,
        }
    return report


@dataclass(frozen=True)
class Scenario:
    """The rollouts of one benchmark run and the online evidence read after them."""

    redis: Any
    traffic: Traffic
    args: argparse.Namespace
    run: str
    versions: Versions
    offline: dict[str, dict[str, float]]

    async def rollout(self, old: Any, new: Any, prefix: str) -> dict[str, Any]:
        return await run_rollout(
            redis=self.redis, traffic=self.traffic, old=old.version, new=new.version,
            args=self.args, prefix=f"{self.run}-{prefix}-", bucket_s=self.args.bucket,
        )  # fmt: skip

    async def online(self, versions: Sequence[Any], since_ms: int) -> dict[str, Any]:
        """Each version's online summary since ``since_ms``, once the last clicks are joined."""
        from scoring.rollout.online import Window, read_summaries
        from streamrank import clock

        await asyncio.sleep(3)  # the last clicks of the scenario are joined
        window = Window(since_ms, clock.now_ms(), self.args.bucket)
        return await read_summaries(self.redis, [v.version for v in versions], window)

    async def bad_then_good(self, *, since_ms: int) -> dict[str, Any]:
        """``bad``: the bad version must be rolled back; ``good``: then A over it promoted."""
        good, bad = self.versions.good, self.versions.bad
        say(f"bad: rolling {bad.version} out over {good.version}")
        bad_run = await self.rollout(good, bad, "bad")
        say(f"good: rolling {good.version} out over {bad.version}")
        good_run = await self.rollout(bad, good, "good")
        online = await self.online([good, bad], since_ms)
        promoted, rolled_back = good_run["status"] == "promoted", bad_run["status"] == "rolled_back"
        return {
            "good": {
                "version": good.version,
                "promoted": promoted,
                **_auc_entry(online[good.version], self.offline[good.version]["auc"]),
                "seconds_to_promote": good_run["seconds"] if promoted else None,
                "rollout": good_run,
            },
            "bad": {
                "version": bad.version,
                "rolled_back": rolled_back,
                **_auc_entry(online[bad.version], self.offline[bad.version]["auc"]),
                "seconds_to_rollback": bad_run["seconds"] if rolled_back else None,
                "rollout": bad_run,
            },
        }

    async def equal(self) -> dict[str, Any]:
        """``equal``: B over A ``--equal-runs`` times; every rollback is a false one."""
        from streamrank import clock

        good, equal = self.versions.good, self.versions.equal
        runs = []
        eq_start = clock.now_ms()
        for seed in range(self.args.equal_runs):
            say(f"equal {seed + 1}/{self.args.equal_runs}: {equal.version} over {good.version}")
            runs.append(await self.rollout(good, equal, f"eq{seed}"))
        online = await self.online([good, equal], eq_start)
        pair = (good.version, equal.version)
        return {
            "versions": list(pair),
            "runs": len(runs),
            "false_rollbacks": sum(r["status"] == "rolled_back" for r in runs),
            "promoted": sum(r["status"] == "promoted" for r in runs),
            "offline_auc": {v: self.offline[v]["auc"] for v in pair},
            "online_auc": {v: online[v].auc.to_json() for v in pair},
            "seconds_to_promote": [r["seconds"] for r in runs],
            "runs_detail": runs,
        }


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from workbench.bench.private_stack import on_private_stack, work_dir

    work = work_dir(settings, "rollout")
    if args.use_stack:
        report = asyncio.run(_bench(settings, args, work))
        report["stack"] = "configured"
        return report
    report = on_private_stack(settings, work, lambda s: _bench(s, args, work), name="rollout")
    report["stack"] = "private embedded"
    return report
