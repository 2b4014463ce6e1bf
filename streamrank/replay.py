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
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from tqdm import tqdm

from schemas import ClickEvent
from streamrank import kafka
from streamrank.errors import StreamrankError
from streamrank.redis_client import redis_client
from streamrank.settings import Settings

logger = logging.getLogger(__name__)

# MovieLens-100K clicks are from 1997-98. The features worker dead-letters clicks further than
# max_event_skew_s from now (a guard against broken producer clocks); a historical replay must
# keep the original ts so the (ts, event_id) order is exactly the offline one, so the replay's
# own features worker accepts any ts within ~100 years.
HISTORICAL_SKEW_S = 100 * 365 * 24 * 3600
# The replay checks scores, not latency: a burst of queued requests must not expire on a busy
# host and come back degraded with neutral scores.
REPLAY_BUDGET_MS = 120_000


@dataclass(frozen=True, slots=True)
class Case:
    """One test user of the artifact: history events (oldest first), candidates, labels."""

    user_id: str
    items: tuple[str, ...]
    labels: tuple[int, ...]
    history: tuple[dict[str, Any], ...]  # event_id, item_id, category, ts (epoch ms)
    file_scores: tuple[float, ...]  # offline DIN scores written by train (fp32 item table)


def load_cases(path: Path, *, limit: int | None = None) -> list[Case]:
    """The test users of ``test_candidates.jsonl`` (the first ``limit`` of them)."""
    if not path.is_file():
        raise StreamrankError(
            f"{path} is missing: the replay needs an artifact written by `streamrank train`"
        )
    cases: list[Case] = []
    with path.open("rb") as fh:
        for line in fh:
            if limit is not None and len(cases) >= limit:
                break
            row = orjson.loads(line)
            cases.append(
                Case(
                    user_id=str(row["user_id"]),
                    items=tuple(row["items"]),
                    labels=tuple(int(x) for x in row["labels"]),
                    history=tuple(row["history"]),
                    file_scores=tuple(row["scores"]["din"]),
                )
            )
    if not cases:
        raise StreamrankError(f"{path} holds no test users")
    widths = {len(c.items) for c in cases}
    if len(widths) != 1:
        raise StreamrankError(f"{path}: users have different candidate counts {sorted(widths)}")
    return cases


def offline_scores(
    artifact: Any,
    cases: Sequence[Case],
    *,
    encoding: str,
    max_history: int,
    batch_users: int = 64,
) -> npt.NDArray[np.float32]:
    """``[U, C]`` scores of the artifact's scorer with its item table (and OOV row) put through
    ``encoding`` and back: what a worker serving the published rows should answer."""
    from scoring.embeddings.codec import roundtrip
    from scoring.serving.assemble import assemble, gather

    table = roundtrip(artifact.item_table, encoding)  # [rows, d]
    oov = roundtrip(artifact.oov_row[None, :], encoding)[0]  # [d]
    table = np.vstack([table, oov[None, :]])  # the last row answers unknown ids
    row_of = {item: i for i, item in enumerate(artifact.item_ids)}
    unknown = len(artifact.item_ids)
    scorer = artifact.scorer()
    out = np.zeros((len(cases), len(cases[0].items)), dtype=np.float32)
    for start in range(0, len(cases), batch_users):
        chunk = cases[start : start + batch_users]
        batch = assemble(
            [[e["item_id"] for e in c.history] for c in chunk],
            [list(c.items) for c in chunk],
            max_history=max_history,
        )
        index = np.fromiter(
            (row_of.get(i, unknown) for i in batch.unique_ids), np.int64, len(batch.unique_ids)
        )
        hist, cands = gather(table[index], batch)  # [b, L, d], [b, C, d]
        out[start : start + len(chunk)] = scorer.score(
            hist, batch.hist_mask, cands, batch.cand_mask
        )
    return out


def quality(labels: npt.ArrayLike, scores: npt.ArrayLike) -> dict[str, float]:
    from scoring.training.evaluation import auc, gauc

    return {"auc": round(auc(labels, scores), 6), "gauc": round(gauc(labels, scores), 6)}


def differences(expected: npt.ArrayLike, online: npt.ArrayLike) -> dict[str, float]:
    """Max, p99 and mean absolute difference over every candidate."""
    diff = np.abs(np.asarray(online, np.float64) - np.asarray(expected, np.float64)).reshape(-1)
    return {
        "max_abs_diff": float(diff.max()),
        "p99_abs_diff": float(np.quantile(diff, 0.99)),
        "mean_abs_diff": float(diff.mean()),
    }


def click_events(cases: Sequence[Case], *, run: str) -> list[ClickEvent]:
    """The histories as ClickEvents with the original ts; user and event ids prefixed with the
    run id (one shared prefix keeps the string order of event ids, hence the sequence order)."""
    return [
        ClickEvent(
            event_id=f"{run}-{e['event_id']}",
            user_id=f"{run}-{c.user_id}",
            item_id=e["item_id"],
            category=e.get("category") or None,
            ts=int(e["ts"]),
        )
        for c in cases
        for e in c.history
    ]


def expected_sequences(cases: Sequence[Case], *, run: str, length: int) -> dict[str, list[str]]:
    """Per (prefixed) user: the event ids Redis must hold once every click is applied."""
    out = {}
    for c in cases:
        ordered = sorted(c.history, key=lambda e: (int(e["ts"]), str(e["event_id"])))
        out[f"{run}-{c.user_id}"] = [f"{run}-{e['event_id']}" for e in ordered[-length:]]
    return out


def run_settings(settings: Settings, *, run: str, version: str, max_history: int) -> Settings:
    """Settings of the replay's private topics, groups and workers."""
    return settings.model_copy(
        update={
            "topic_clicks": f"{run}-clicks",
            "topic_requests": f"{run}-rank-requests",
            "topic_results": f"{run}-rank-results",
            "topic_dead_letters": f"{run}-dead-letters",
            "features_app_id": f"{run}-features",
            "scoring_group_id": f"{run}-scoring",
            "max_event_skew_s": HISTORICAL_SKEW_S,
            "sequence_length": max_history,
            "scoring_budget_ms": REPLAY_BUDGET_MS,
            "canary_split": f"{version}:1",
            "metrics_port": 0,
            "served_log_topic": None,
        }
    )


def say(message: str) -> None:
    print(f"replay: {message}", file=sys.stderr, flush=True)


async def _produce(settings: Settings, events: Sequence[ClickEvent], *, progress: bool) -> None:
    producer = kafka.producer(settings, acks="all", linger_ms=5)
    await producer.start()
    try:
        with tqdm(total=len(events), desc="produce clicks", unit="ev", disable=not progress) as bar:
            for start in range(0, len(events), 1000):
                chunk = events[start : start + 1000]
                futures = [
                    await producer.send(settings.topic_clicks, e.to_json(), key=e.user_id.encode())
                    for e in chunk
                ]
                await asyncio.gather(*futures)
                bar.update(len(chunk))
    finally:
        await producer.stop()


async def _wait_applied(
    redis: Any,
    settings: Settings,
    expected: dict[str, list[str]],
    *,
    timeout_s: float,
    progress: bool,
    log_path: Path | None,
) -> None:
    """Poll the sequences (one round trip per poll) until every user holds exactly its events."""
    from streams.reader import FeatureReader

    reader = FeatureReader(redis=redis, settings=settings)
    deadline = time.monotonic() + timeout_s
    done = 0
    with tqdm(
        total=len(expected), desc="features applied", unit="user", disable=not progress
    ) as bar:
        while True:
            sequences = await reader.get_sequences(expected)
            missing = [
                u for u, ids in expected.items() if [e.event_id for e in sequences[u]] != ids
            ]
            bar.update(len(expected) - len(missing) - done)
            done = len(expected) - len(missing)
            if not missing:
                return
            if time.monotonic() > deadline:
                user = missing[0]
                raise StreamrankError(
                    f"after {timeout_s:.0f}s, {len(missing)} of {len(expected)} users' sequences "
                    f"in Redis still differ from their replayed events (e.g. {user}: "
                    f"{len(sequences[user])} of {len(expected[user])} events); see the features "
                    f"worker log {log_path} and the dead-letter topic {settings.topic_dead_letters}"
                )
            await asyncio.sleep(0.25)


async def _rank_all(
    settings: Settings,
    cases: Sequence[Case],
    *,
    run: str,
    concurrency: int,
    timeout_s: float,
    progress: bool,
) -> tuple[list[Any], list[float]]:
    """One RankRequest per user (at most ``concurrency`` in flight); replies in case order
    (None where no reply came) and the client-observed latencies in ms."""
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
                            f"{run}-{case.user_id}", case.items, request_id=f"{run}-req-{i}"
                        )
                        latencies.append((time.perf_counter() - started) * 1000)
                    except (RankTimeout, RankRejected) as exc:
                        logger.warning("user %s: %s", case.user_id, exc)
                    bar.update(1)

            await asyncio.gather(*(one(i, c) for i, c in enumerate(cases)))
    return results, latencies


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

    from scoring.model.registry import activate_version
    from streamrank.devstack.pipeline import ensure_published
    from streamrank.devstack.processes import start_worker
    from streamrank.topics import create_topics

    started = time.perf_counter()
    seconds: dict[str, float] = {}
    run = f"replay-{uuid.uuid4().hex[:8]}"
    max_history = int(artifact.config.get("train", {}).get("history_len", settings.sequence_length))
    redis = redis_client(settings)
    try:
        published = await ensure_published(redis, artifact, encoding=encoding, progress=progress)
        version, enc = published["version"], published["encoding"]
        if activate:
            await activate_version(redis, version)
        say(f"version {version} ({enc}; published now: {published['published_now']}); run {run}")
        rs = run_settings(settings, run=run, version=version, max_history=max_history)
        await create_topics(rs)

        mark = time.perf_counter()
        expected = offline_scores(artifact, cases, encoding=enc, max_history=max_history)
        fp32 = offline_scores(artifact, cases, encoding="fp32", max_history=max_history)
        seconds["offline"] = time.perf_counter() - mark

        logs = Path(rs.run_dir) / run
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

            events = click_events(cases, run=run)
            mark = time.perf_counter()
            await _produce(rs, events, progress=progress)
            seconds["produce"] = time.perf_counter() - mark
            mark = time.perf_counter()
            await _wait_applied(
                redis, rs, expected_sequences(cases, run=run, length=max_history),
                timeout_s=apply_timeout_s, progress=progress, log_path=features.log_path,
            )  # fmt: skip
            seconds["apply"] = time.perf_counter() - mark

            mark = time.perf_counter()
            results, latencies = await _rank_all(
                rs, cases, run=run, concurrency=concurrency,
                timeout_s=request_timeout_s, progress=progress,
            )  # fmt: skip
            seconds["rank"] = time.perf_counter() - mark
        finally:
            codes = await asyncio.gather(
                asyncio.to_thread(scoring.stop), asyncio.to_thread(features.stop)
            )
            if any(codes):
                logger.warning("worker exit codes (scoring, features): %s; logs in %s", codes, logs)
    finally:
        await redis.aclose()

    answered = [i for i, r in enumerate(results) if r is not None]
    degraded = sum(1 for i in answered if results[i].degraded)
    labels = np.array([cases[i].labels for i in answered], dtype=np.float32)  # [U', C]
    online = np.array([results[i].scores for i in answered], dtype=np.float64)  # [U', C]
    offline = expected[answered]
    file_scores = np.array([c.file_scores for c in cases], dtype=np.float64)
    diffs = differences(offline, online) if answered else {}
    report: dict[str, Any] = {
        "version": version,
        "encoding": enc,
        "users": len(cases),
        "candidates_per_user": len(cases[0].items),
        "events_replayed": len(events),
        "requests": len(cases),
        "answered": len(answered),
        "degraded": degraded,
        "versions_served": sorted({results[i].model_version for i in answered}),
        **diffs,
        "tolerance": tolerance,
        "offline": quality(labels, offline) if answered else None,
        "online": quality(labels, online) if answered else None,
        "offline_fp32": quality(np.array([c.labels for c in cases]), fp32),
        "offline_fp32_vs_artifact_scores_max_abs_diff": float(np.abs(fp32 - file_scores).max()),
        "client_latency_ms": {
            "p50": round(float(np.percentile(latencies, 50)), 2) if latencies else None,
            "p99": round(float(np.percentile(latencies, 99)), 2) if latencies else None,
        },
        "activated": activate,
        "redis": settings.redis_mode,
        "run": run,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }
    report["consistent"] = bool(
        answered
        and len(answered) == len(cases)
        and degraded == 0
        and report["versions_served"] == [version]
        and report["max_abs_diff"] <= tolerance
        and report["online"]["auc"] == report["offline"]["auc"]
    )
    report["seconds"]["total"] = round(time.perf_counter() - started, 2)
    return report


def newest_artifact(root: Path) -> Path:
    """The most recently written artifact under ``root`` that has test candidates."""
    from scoring.model.artifact import CANDIDATES_FILE, CONFIG_FILE

    found = [
        p for p in Path(root).glob(f"*/{CANDIDATES_FILE}") if (p.parent / CONFIG_FILE).is_file()
    ]
    if not found:
        raise StreamrankError(
            f"no artifact with {CANDIDATES_FILE} under {root}; train one with "
            "`streamrank train --out DIR` and pass --artifact DIR/<version>"
        )
    return max(found, key=lambda p: p.stat().st_mtime).parent
