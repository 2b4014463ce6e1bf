"""``bench scoring --features``: what the side features cost end to end. The same requests
saturate a worker serving a sequence-only version and one serving a version with every feature
family (counters, context, user attributes: their reads ride in the sequences' round trip),
alternating, in the same run; the figure is the ratio of their best max_rps."""

from __future__ import annotations

import argparse
from typing import Any

from scoring.model.features import AGE_BUCKETS, FAMILIES, FeatureSpec
from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from workbench.bench.loadgen import Driver
from workbench.bench.scoring_phases import (
    SCORING_CLI,
    Request,
    phase_settings,
    phase_topics,
    warm_up,
    worker_env,
    worker_process,
)

GOAL_FEATURES_SHARE = 0.85
ROUNDS = 2
WARM_UP = 200


def bench_feature_spec(history: int) -> FeatureSpec:
    """Every family, MovieLens-sized vocabularies."""
    return FeatureSpec(
        families=FAMILIES,
        sequence_length=history,
        windows={"1h": 300, "24h": 3600},
        user_attributes={
            "age": AGE_BUCKETS,
            "gender": ("F", "M"),
            "occupation": tuple(f"o{n}" for n in range(21)),
        },
    )


def requests_needed(args: argparse.Namespace) -> int:
    return ROUNDS * 2 * (WARM_UP + args.saturation_requests)


async def saturate_version(
    settings: Settings, version: str, *, phase: str, mode: str, requests: list[Request]
) -> tuple[float, int]:
    """One worker serving ``version``: warmed up, then every request queued at once; its
    max_rps and degraded replies."""
    ph = phase_settings(settings, phase)
    await create_topics(ph, topics=phase_topics(ph))
    env = worker_env(ph, STREAMRANK_CANARY_SPLIT=f"{version}:1", STREAMRANK_SCORING_FORWARD=mode,
                     STREAMRANK_SCORING_GROUP_ID=f"bench-scoring-{version}-{phase}")  # fmt: skip
    with worker_process(SCORING_CLI, env):
        async with Driver(settings=settings, requests_topic=ph.topics.requests,
                          results_topic=ph.topics.results) as driver:  # fmt: skip
            await warm_up(driver, requests[:WARM_UP])
            rps, stats = await driver.saturate(requests[WARM_UP:])
    return rps, stats.degraded


async def features_ab(
    args: argparse.Namespace,
    settings: Settings,
    *,
    sequence_version: str,
    features_version: str,
    mode: str,
    requests: list[Request],
) -> dict[str, Any]:
    """Both versions saturated ``ROUNDS`` times each, alternating; the best of each."""
    per_run = WARM_UP + args.saturation_requests
    best = {"sequence": 0.0, "features": 0.0}
    degraded = {"sequence": 0, "features": 0}
    versions = {"sequence": sequence_version, "features": features_version}
    cursor = 0
    for n in range(ROUNDS):
        for name, version in versions.items():
            chunk = requests[cursor : cursor + per_run]
            cursor += per_run
            rps, bad = await saturate_version(
                settings, version, phase=f"ab-{name}-{n}", mode=mode, requests=chunk
            )
            best[name] = max(best[name], rps)
            degraded[name] += bad
    ratio = best["features"] / best["sequence"] if best["sequence"] else 0.0
    return {
        "sequence_max_rps": round(best["sequence"], 1),
        "features_max_rps": round(best["features"], 1),
        "features_vs_sequence": round(ratio, 3),
        "degraded": degraded,
        "forward_mode": mode,
        "rounds": ROUNDS,
        "goal": f"features_vs_sequence >= {GOAL_FEATURES_SHARE}",
        "goal_met": ratio >= GOAL_FEATURES_SHARE,
    }
