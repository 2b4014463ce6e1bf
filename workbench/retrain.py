"""One cycle of the learning loop (``streamrank retrain``): export the served log joined with its
outcomes -> train a candidate warm-started from the active version -> gate it against the active
version on a held-out slice of the same logs -> publish -> start a staged rollout.

Every cycle is recorded in Redis (:mod:`scoring.rollout.cycles`) whatever its outcome, so the
rollout status and the metrics show a refused, skipped or failed cycle as well as a published
one. A candidate the gate refuses stays on disk, unpublished; nothing serving changes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scoring.model.artifact import Artifact, load_artifact, resolve_artifact_path
from scoring.model.registry import activate_version, active_version, publish_artifact
from scoring.rollout.cycles import RetrainCycle, record_cycle
from scoring.rollout.driver import start_rollout
from scoring.rollout.state import RolloutStore
from scoring.training.from_dataset import (
    DatasetTrainConfig,
    export_from_dataset,
    train_from_samples,
)
from scoring.training.gate import GateDecision, GateRule, decide
from scoring.training.served_data import ServedSample, time_split
from scoring.training.served_eval import evaluate_on_samples
from streamrank import clock
from streamrank.errors import ConfigError, StreamrankError
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from workbench.served_dataset import dataset_info, export_dataset, read_samples

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutPlan:
    """How a published candidate rolls out (the options of ``streamrank rollout start``)."""

    steps: str
    hold_s: float
    min_outcomes: int
    guard: str


@dataclass(frozen=True, kw_only=True, slots=True)
class CyclePlan:
    rollout: RolloutPlan
    artifacts_dir: Path
    dataset_format: str = "jsonl"
    progress: bool = False
    by: str = "retrain"


async def run_cycle(settings: Settings, plan: CyclePlan) -> RetrainCycle:
    """Run one cycle and record it; a cycle that raised is recorded as failed, then re-raised."""
    started = clock.now_ms()
    redis = redis_client(settings.redis)
    try:
        try:
            cycle = await _cycle(redis, settings, plan, started)
        except Exception as exc:
            failed = RetrainCycle(started, clock.now_ms(), "failed", f"{type(exc).__name__}: {exc}")
            await record_cycle(redis, failed)
            raise
        await record_cycle(redis, cycle)
        return cycle
    finally:
        await redis.aclose()


async def _cycle(redis: Any, settings: Settings, plan: CyclePlan, started: int) -> RetrainCycle:
    state = await RolloutStore(redis=redis).read()
    if state is not None and state.active:
        return RetrainCycle(started, clock.now_ms(), "skipped",
                            f"the rollout of {state.new} is {state.status}: one at a time",
                            active=state.old, candidate=state.new)  # fmt: skip
    active = await active_version(redis)
    r = settings.retrain
    samples, dataset = await export_samples(settings, plan, now_ms=started)
    train, holdout = time_split(samples, r.holdout_share)
    if len(holdout) < r.gate_min_samples:
        return RetrainCycle(started, clock.now_ms(), "skipped",
                            f"{len(holdout)} held-out requests in the last {r.lookback_h:g} h "
                            f"(fewer than {r.gate_min_samples}): not enough served log yet",
                            active=active, dataset=dataset)  # fmt: skip
    base = _active_artifact(active, plan.artifacts_dir)
    if r.incremental and r.warm_start:
        train = served_after(train, trained_until(base))
    if len(train) < r.gate_min_samples:
        return RetrainCycle(started, clock.now_ms(), "skipped",
                            f"{len(train)} requests to train on since the active version's data "
                            f"(fewer than {r.gate_min_samples})", active=active,
                            dataset=dataset)  # fmt: skip
    candidate = train_candidate(settings, plan, train, warm=base if r.warm_start else None,
                                dataset_path=Path(dataset["path"]))  # fmt: skip
    decision = gate(candidate, base, holdout, settings)
    if not decision.passed:
        return RetrainCycle(started, clock.now_ms(), "refused", decision.reason, active=active,
                            candidate=candidate.version, gate=decision.to_json(),
                            dataset=dataset)  # fmt: skip
    await publish_artifact(redis, candidate, progress=plan.progress)
    if active is None:
        await activate_version(redis, candidate.version, features=settings.features)
        how = "activated (no version was active)"
    else:
        rollout = await start_rollout(
            redis, new=candidate.version, steps=plan.rollout.steps, hold_s=plan.rollout.hold_s,
            min_outcomes=plan.rollout.min_outcomes, guard=plan.rollout.guard, by=plan.by,
        )  # fmt: skip
        how = f"rollout started at {rollout.steps[0]}% over {active}"
    return RetrainCycle(started, clock.now_ms(), "published", f"{decision.reason}; {how}",
                        active=active, candidate=candidate.version, gate=decision.to_json(),
                        dataset=dataset)  # fmt: skip


def trained_until(artifact: Artifact | None) -> int | None:
    """The newest served_at among the requests ``artifact`` was trained on (None: it was not
    trained on the served log)."""
    if artifact is None:
        return None
    samples = (artifact.config.get("metrics") or {}).get("samples") or {}
    newest = (samples.get("served_at") or {}).get("max")
    return int(newest) if newest is not None else None


def served_after(samples: Sequence[ServedSample], until_ms: int | None) -> list[ServedSample]:
    """The requests served after ``until_ms`` (all of them when None)."""
    return list(samples) if until_ms is None else [s for s in samples if s.served_at > until_ms]


def _active_artifact(active: str | None, artifacts_dir: Path) -> Artifact | None:
    """The active version's artifact (None: nothing is active yet)."""
    if active is None:
        return None
    try:
        return load_artifact(resolve_artifact_path(active, artifacts_dir))
    except StreamrankError as exc:
        raise ConfigError(
            f"the active version {active!r} has no artifact under {artifacts_dir} ({exc}): "
            "the cycle gates against it (and warm-starts from it); copy its artifact there"
        ) from exc


async def export_samples(
    settings: Settings, plan: CyclePlan, *, now_ms: int
) -> tuple[list[ServedSample], dict[str, Any]]:
    """The last ``lookback_h`` of the served log joined with its outcomes, written under the
    dataset directory (one file per cycle) and read back; returns the samples and what the
    cycle records of the dataset."""
    r = settings.retrain
    suffix = "parquet" if plan.dataset_format == "parquet" else "jsonl"
    path = Path(r.dataset_dir) / f"served-{now_ms}.{suffix}"
    since = now_ms - int(r.lookback_h * 3_600_000)
    manifest = await export_dataset(settings, path, fmt=plan.dataset_format,  # type: ignore[arg-type]
                                    since_ms=since, until_ms=now_ms, progress=plan.progress)  # fmt: skip
    samples = read_samples(path)
    return samples, {"path": str(path), "sha256": manifest["sha256"], "rows": manifest["rows"],
                     "served_versions": manifest["served_versions"]}  # fmt: skip


def train_candidate(
    settings: Settings,
    plan: CyclePlan,
    train: Sequence[ServedSample],
    *,
    warm: Artifact | None,
    dataset_path: Path,
) -> Artifact:
    """Train on the cycle's training share (warm-started from ``warm``) and export it."""
    cfg = DatasetTrainConfig(
        epochs=settings.retrain.epochs,
        lr=settings.retrain.lr,
        negatives=settings.retrain.negatives or None,
        threads=settings.scoring.torch_threads,
        encoding=settings.embeddings.encoding,
        history_len=settings.features.sequence_length,
        bucket_s=(settings.features.counter_bucket_s, settings.features.counter_coarse_bucket_s),
    )
    result = train_from_samples(train, cfg, warm=warm, progress=plan.progress)
    path = export_from_dataset(result, cfg, dataset_info(dataset_path), plan.artifacts_dir)
    return load_artifact(path)


def gate(
    candidate: Artifact,
    active: Artifact | None,
    holdout: Sequence[ServedSample],
    settings: Settings,
) -> GateDecision:
    """Both versions rescored on the same held-out requests, as served."""
    r = settings.retrain
    rule = GateRule(metric=r.gate_metric, tolerance=r.gate_tolerance,
                    min_samples=r.gate_min_samples)  # fmt: skip
    mine = evaluate_on_samples(candidate, holdout)
    theirs = evaluate_on_samples(active, holdout) if active is not None else None
    if theirs is not None and theirs["skipped"] != mine["skipped"]:
        raise ConfigError(
            f"the gate would compare different requests: {mine['skipped']} held-out requests "
            f"lack an input of the candidate, {theirs['skipped']} of the active version (their "
            "feature specs differ); train with the active version's spec (warm start)"
        )
    log.info("gate on %s held-out requests: candidate %s, active %s", len(holdout), mine, theirs)
    return decide(mine, theirs, rule)
