"""``streamrank replay``: the online/offline consistency check, end to end through Kafka.

The product promise: the scores served through Kafka equal the scores the offline evaluation
computes for the same events, so a model's offline AUC reappears online. The replay takes an
artifact's ``test_candidates.jsonl`` (per test user: the history events, the candidates, the
labels), replays every history event as a ClickEvent through a features worker into Redis, sends
one RankRequest per user with the same candidates through a scoring worker, and compares the
replies with the offline expectation: the artifact's scorer on the same histories and candidates,
with the item table put through the encoding it is published in (the stored rows are int8 by
default, so the fp32 scores in the file are not the right reference).

Isolation, so it never mixes with other traffic on a shared stack: private topics and consumer
groups, user ids and event ids prefixed with the run id (the features worker dedupes by event
id, and sequences are keyed by user id), and the scoring worker pinned to the version by a
static split (``canary_split``) instead of moving the shared ``sr:model:active`` pointer.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from scoring.model.din import features_of
from scoring.serving.wiring import RUNTIME_LOG
from scoring.training.export import EVENTS_FILE
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from workbench.devstack.cases import (
    Case,
    click_events,
    expected_sequences,
    offline_scores,
    private_run,
    produce_clicks,
    quality,
    wait_applied,
)
from workbench.devstack.replaylog import (
    ReplayLog,
    delete_keys,
    delete_user_keys,
    item_keys,
    load_attributes,
    load_log,
)

logger = logging.getLogger(__name__)


def differences(expected: npt.ArrayLike, online: npt.ArrayLike) -> dict[str, float]:
    """Max, p99 and mean absolute difference over every candidate."""
    diff = np.abs(np.asarray(online, np.float64) - np.asarray(expected, np.float64)).reshape(-1)
    return {
        "max_abs_diff": float(diff.max()),
        "p99_abs_diff": float(np.quantile(diff, 0.99)),
        "mean_abs_diff": float(diff.mean()),
    }


def run_settings(
    settings: Settings, *, run: str, version: str, max_history: int, log: ReplayLog | None = None
) -> Settings:
    """Settings of the replay's private topics, groups and workers."""
    env: dict[str, Any] = {
        **private_run(run),
        "STREAMRANK_SEQUENCE_LENGTH": max_history,
        "STREAMRANK_CANARY_SPLIT": f"{version}:1",
        "STREAMRANK_SERVED_LOG_TOPIC": None,
    }
    return settings.with_env(**{**env, **(log.settings_env() if log is not None else {})})


def history_len(artifact: Any, settings: Settings) -> int:
    """The history length the artifact was trained with (the replay's sequence length)."""
    train = artifact.config.get("train", {})
    return int(train.get("history_len", settings.features.sequence_length))


async def clean_up(redis: Any, log: ReplayLog | None, *, run: str, settings: Settings) -> None:
    """The run's item counters and user keys removed (a replay of the whole log), then the
    client closed, whatever happened before."""
    try:
        if log is not None:
            await delete_keys(redis, item_keys(log.events, settings.features))
            await delete_user_keys(redis, run)
    finally:
        await redis.aclose()


def say(message: str) -> None:
    print(f"replay: {message}", file=sys.stderr, flush=True)


async def _rank_all(
    settings: Settings,
    cases: Sequence[Case],
    *,
    run: str,
    concurrency: int,
    timeout_s: float,
    progress: bool,
    top_k: int | None = None,
) -> tuple[list[Any], list[float]]:
    """One RankRequest per user (at most ``concurrency`` in flight): its candidates, or with
    ``top_k`` a retrieval request (no items); replies in case order (None where no reply came)
    and the client-observed latencies in ms."""
    from scoring.client import RankClient, RankRejected, RankTimeout

    results: list[Any] = [None] * len(cases)
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)
    async with RankClient(settings=settings, default_timeout_s=timeout_s) as client:
        with tqdm(total=len(cases), desc="rank requests", unit="req", disable=not progress) as bar:

            async def one(i: int, case: Case) -> None:
                async with gate:
                    started = time.perf_counter()
                    try:
                        results[i] = await client.rank(
                            f"{run}-{case.user_id}", None if top_k else case.items,
                            top_k=top_k, request_id=f"{run}-req-{i}", ts=case.ts,
                        )  # fmt: skip
                        latencies.append((time.perf_counter() - started) * 1000)
                    except (RankTimeout, RankRejected) as exc:
                        logger.warning("user %s: %s", case.user_id, exc)
                    bar.update(1)

            await asyncio.gather(*(one(i, c) for i, c in enumerate(cases)))
    return results, latencies


@dataclass(frozen=True)
class Replayed:
    """What came back through the stack: the replies in case order (None where no reply came)
    and the client-observed latencies in ms, after ``events`` clicks were replayed."""

    events: int
    results: list[Any]
    latencies: list[float]
    runtimes: tuple[str, ...] = ()  # the forward runtimes the scoring worker logged


def served_runtimes(log_text: str) -> tuple[str, ...]:
    """The runtimes a scoring worker's log says its versions' forwards ran on, in load order."""
    pattern = re.escape(RUNTIME_LOG).replace("%s", r"(\S+)")
    return tuple(m.group(2) for m in re.finditer(pattern, log_text))


@dataclass(frozen=True)
class Offline:
    """The offline expectation: the scores with the item table as published (``expected``) and
    in fp32 (``fp32``, as the artifact's own evaluation scored them)."""

    expected: np.ndarray
    fp32: np.ndarray


async def run_replay(
    settings: Settings,
    artifact: Any,
    cases: Sequence[Case],
    *,
    encoding: str | None = None,
    concurrency: int = 32,
    tolerance: float = 1e-5,
    apply_timeout_s: float = 300.0,
    request_timeout_s: float = 60.0,
    activate: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Replay ``cases`` through the stack ``settings`` name; returns the report.

    The replay's scoring worker is pinned to the artifact's version by a static split, so the
    shared ``sr:model:active`` pointer is left alone unless ``activate`` is set."""
    from streamrank.kafka.topics import create_topics

    started = time.perf_counter()
    seconds: dict[str, float] = {}
    run = f"replay-{uuid.uuid4().hex[:8]}"
    max_history = history_len(artifact, settings)
    # The worker serves the dense weights as settings.scoring.dense_weights: so does this.
    dense = settings.scoring.dense_weights
    redis = redis_client(settings.redis)
    log = None
    try:
        version, enc = await publish(
            redis, artifact, encoding=encoding, activate=activate, run=run, progress=progress
        )
        if features_of(artifact.config, artifact.spec).counters:
            log = load_log(artifact.path / EVENTS_FILE, cases, run=run, max_history=max_history)
        rs = run_settings(settings, run=run, version=version, max_history=max_history, log=log)
        await create_topics(rs)
        mark = time.perf_counter()
        offline = Offline(
            expected=offline_scores(
                artifact, cases, encoding=enc, max_history=max_history, dense=dense
            ),
            fp32=offline_scores(artifact, cases, encoding="fp32", max_history=max_history),
        )
        seconds["offline"] = time.perf_counter() - mark
        replayed = await through_workers(
            rs, redis, cases, run=run, max_history=max_history, concurrency=concurrency,
            apply_timeout_s=apply_timeout_s, request_timeout_s=request_timeout_s,
            progress=progress, seconds=seconds, log=log,
        )  # fmt: skip
    finally:
        await clean_up(redis, log, run=run, settings=settings)
    report = {
        "version": version,
        "encoding": enc,
        "dense_weights": dense,
        **replay_report(cases, replayed, offline, tolerance=tolerance),
        "activated": activate,
        "redis": settings.redis.mode,
        "run": run,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }
    report["consistent"] = consistent(report, cases=len(cases), version=version)
    report["seconds"]["total"] = round(time.perf_counter() - started, 2)
    return report


async def publish(
    redis: Any, artifact: Any, *, encoding: str | None, activate: bool, run: str, progress: bool
) -> tuple[str, str]:
    """The artifact published (when it is not yet) and, with ``activate``, made the serving
    version; returns its version and encoding."""
    from scoring.model.registry import activate_version
    from workbench.devstack.pipeline import ensure_published

    published = await ensure_published(redis, artifact, encoding=encoding, progress=progress)
    version, enc = published["version"], published["encoding"]
    if activate:
        await activate_version(redis, version)
    say(f"version {version} ({enc}; published now: {published['published_now']}); run {run}")
    return version, enc


async def through_workers(
    rs: Settings,
    redis: Any,
    cases: Sequence[Case],
    *,
    run: str,
    max_history: int,
    concurrency: int,
    apply_timeout_s: float,
    request_timeout_s: float,
    progress: bool,
    seconds: dict[str, float],
    log: ReplayLog | None = None,
    top_k: int | None = None,
    categories: dict[str, str] | None = None,
) -> Replayed:
    """A features and a scoring worker of the run's own, the clicks (the test histories, or the
    whole log for a version with counters) replayed and applied, the attributes (and the item
    ``categories``) loaded, then the rank requests (retrieval ones with ``top_k``); the workers
    are stopped at the end."""
    from workbench.devstack.processes import start_worker

    logs = Path(rs.tools.run_dir) / run
    mark = time.perf_counter()
    features = start_worker("features", rs, log_path=logs / "features-worker.log")
    scoring = start_worker("scoring", rs, log_path=logs / "scoring-worker.log")
    try:
        say(f"waiting for the workers (pids {features.pid}, {scoring.pid}; logs in {logs})")
        await asyncio.gather(
            asyncio.to_thread(features.wait_ready, 180),
            asyncio.to_thread(scoring.wait_ready, 180),
        )  # fmt: skip
        seconds["start_workers"] = time.perf_counter() - mark

        events = click_events(cases, run=run) if log is None else log.events
        expected = (
            expected_sequences(cases, run=run, length=max_history) if log is None else log.sequences
        )
        if log is not None:
            await delete_keys(redis, item_keys(events, rs.features))  # a crashed run's counts
        await load_attributes(redis, cases, run=run, categories=categories)
        mark = time.perf_counter()
        await produce_clicks(rs, events, progress=progress)
        seconds["produce"] = time.perf_counter() - mark
        mark = time.perf_counter()
        await wait_applied(
            redis, rs, expected, timeout_s=apply_timeout_s, progress=progress,
            log_path=features.log_path,
        )  # fmt: skip
        seconds["apply"] = time.perf_counter() - mark

        mark = time.perf_counter()
        results, latencies = await _rank_all(
            rs, cases, run=run, concurrency=concurrency,
            timeout_s=request_timeout_s, progress=progress, top_k=top_k,
        )  # fmt: skip
        seconds["rank"] = time.perf_counter() - mark
        return Replayed(len(events), results, latencies, served_runtimes(scoring.log_text()))
    finally:
        codes = await asyncio.gather(
            asyncio.to_thread(scoring.stop), asyncio.to_thread(features.stop)
        )
        if any(codes):
            logger.warning("worker exit codes (scoring, features): %s; logs in %s", codes, logs)


def replay_report(
    cases: Sequence[Case], replayed: Replayed, offline: Offline, *, tolerance: float
) -> dict[str, Any]:
    """The replies set against the offline expectation: coverage, differences, quality."""
    results, latencies = replayed.results, replayed.latencies
    answered = [i for i, r in enumerate(results) if r is not None]
    labels = np.array([cases[i].labels for i in answered], dtype=np.float32)  # [U', C]
    online = np.array([results[i].scores for i in answered], dtype=np.float64)  # [U', C]
    expected = offline.expected[answered]
    file_scores = np.array([c.file_scores for c in cases], dtype=np.float64)
    return {
        "users": len(cases),
        "candidates_per_user": len(cases[0].items),
        "events_replayed": replayed.events,
        "requests": len(cases),
        "answered": len(answered),
        "degraded": sum(1 for i in answered if results[i].degraded),
        "versions_served": sorted({results[i].model_version for i in answered}),
        "runtimes_served": sorted(set(replayed.runtimes)),
        "offline_runtime": "eager",  # the artifact's torch scorer, op by op
        **(differences(expected, online) if answered else {}),
        "tolerance": tolerance,
        "offline": quality(labels, expected) if answered else None,
        "online": quality(labels, online) if answered else None,
        "offline_fp32": quality(np.array([c.labels for c in cases]), offline.fp32),
        "offline_fp32_vs_artifact_scores_max_abs_diff": float(
            np.abs(offline.fp32 - file_scores).max()
        ),
        "client_latency_ms": {
            "p50": round(float(np.percentile(latencies, 50)), 2) if latencies else None,
            "p99": round(float(np.percentile(latencies, 99)), 2) if latencies else None,
        },
    }


def consistent(report: dict[str, Any], *, cases: int, version: str) -> bool:
    """Every user answered, none degraded, all by ``version``, within the tolerance, and the
    same AUC online as offline."""
    return bool(
        report["answered"]
        and report["answered"] == cases
        and report["degraded"] == 0
        and report["versions_served"] == [version]
        and report["max_abs_diff"] <= report["tolerance"]
        and report["online"]["auc"] == report["offline"]["auc"]
    )
