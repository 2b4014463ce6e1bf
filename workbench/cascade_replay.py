"""``streamrank replay --cascade``: the online cascade reproduces the offline one, end to end
through Kafka.

The artifact's ``cascade_test.jsonl`` holds, per test user, the request time, the history and
the offline cascade's reply (items best first, their DIN probabilities). The replay replays the
histories (the whole log for a version with counters) as clicks through a features worker,
loads the attributes and every item's category, then sends ONE retrieval request per user (no
items, ``top_k`` the offline one, ``ts`` the user's) through a scoring worker pinned to the
version and set up as the offline cascade ran: its widths and rule from config.json, no hot
items merged (the pool is wall-clock state), no result cache, budgets no stage falls back under.

The expectation is the offline cascade (:func:`scoring.training.fullrank.din_cascade`, what
``streamrank train`` evaluates) with the item table as published (int8 by default, so the fp32
replies in the file are not the reference); the same pass on the fp32 table must reproduce the
file. Per user: the same items in the same order, scores within the tolerance.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from scoring.model.din import features_of
from scoring.training.export import EVENTS_FILE
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from workbench.devstack.cascadecases import (
    cascade_config,
    cascade_env,
    history_events,
    item_categories,
    offline_cascade,
)
from workbench.devstack.cases import Case
from workbench.devstack.replaylog import load_log
from workbench.devstack.replaylog import read_events as read_log
from workbench.replay import (
    Replayed,
    clean_up,
    history_len,
    publish,
    run_settings,
    through_workers,
)

SHOWN_MISMATCHES = 5


async def run_cascade_replay(
    settings: Settings,
    artifact: Any,
    cases: Sequence[Case],
    *,
    encoding: str | None = None,
    concurrency: int = 32,
    tolerance: float = 1e-4,
    apply_timeout_s: float = 300.0,
    request_timeout_s: float = 120.0,
    activate: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Replay the cascade ``cases`` through the stack ``settings`` name; returns the report.

    As :func:`workbench.replay.run_replay`: private topics and groups, ids prefixed with the
    run, the worker pinned to the version (``activate`` also moves ``sr:model:active``)."""
    from streamrank.kafka.topics import create_topics

    started = time.perf_counter()
    seconds: dict[str, float] = {}
    run = f"replay-{uuid.uuid4().hex[:8]}"
    max_history = history_len(artifact, settings)
    dense = settings.scoring.dense_weights
    cfg = cascade_config(artifact)
    counters = bool(features_of(artifact.config, artifact.spec).counters)
    redis = redis_client(settings.redis)
    log = None
    try:
        version, enc = await publish(
            redis, artifact, encoding=encoding, activate=activate, run=run, progress=progress
        )
        if counters:
            log = load_log(artifact.path / EVENTS_FILE, cases, run=run, max_history=max_history)
        events = read_log(artifact.path / EVENTS_FILE) if counters else history_events(cases)
        rs = run_settings(settings, run=run, version=version, max_history=max_history, log=log)
        rs = rs.with_env(**cascade_env(cfg))
        await create_topics(rs)
        mark = time.perf_counter()
        threads = settings.scoring.torch_threads
        kw: dict[str, Any] = {"max_history": max_history, "threads": threads, "progress": progress}
        expected = offline_cascade(artifact, cases, events, cfg, encoding=enc, dense=dense, **kw)
        fp32 = offline_cascade(artifact, cases, events, cfg, encoding="fp32", **kw)
        seconds["offline"] = time.perf_counter() - mark
        replayed = await through_workers(
            rs, redis, cases, run=run, max_history=max_history, concurrency=concurrency,
            apply_timeout_s=apply_timeout_s, request_timeout_s=request_timeout_s,
            progress=progress, seconds=seconds, log=log, top_k=cfg.top_k,
            categories=item_categories(artifact.item_ids, events),
        )  # fmt: skip
    finally:
        await clean_up(redis, log, run=run, settings=settings)
    report = {
        "version": version,
        "encoding": enc,
        "dense_weights": dense,
        "cascade": cfg.to_json(),
        "runtimes_served": sorted(set(replayed.runtimes)),
        "offline_runtime": "eager",
        **cascade_report(
            cases,
            replayed,
            (expected.items, expected.scores),
            (fp32.items, fp32.scores),
            tolerance=tolerance,
            top_k=cfg.top_k,
        ),
        "activated": activate,
        "redis": settings.redis.mode,
        "run": run,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }
    report["consistent"] = consistent(report, cases=len(cases), version=version)
    report["seconds"]["total"] = round(time.perf_counter() - started, 2)
    return report


Lists = tuple[Sequence[Sequence[str]], Sequence[Sequence[float]]]  # items and scores per user


def compare_lists(expected: Lists, got: Sequence[Any | None]) -> dict[str, Any]:
    """Per user, the reply ``got[u]`` (``.items``, ``.scores``; None: no reply) against the
    expected items and scores: how many have the same items in the same order, the same set,
    and the score differences over the users with the same items (position by position)."""
    same: list[int] = []
    same_set = 0
    diffs: list[float] = []
    mismatches: list[int] = []
    for u, reply in enumerate(got):
        if reply is None:
            continue
        want_items, want_scores = list(expected[0][u]), expected[1][u]
        if list(reply.items) == want_items:
            same.append(u)
            diffs.extend(
                np.abs(np.asarray(reply.scores, np.float64) - np.asarray(want_scores, np.float64))
            )
        else:
            mismatches.append(u)
        same_set += set(reply.items) == set(want_items)
    out: dict[str, Any] = {"same_items": len(same), "same_set": same_set}
    if diffs:
        d = np.asarray(diffs)
        out |= {
            "max_abs_diff": float(d.max()),
            "p99_abs_diff": float(np.quantile(d, 0.99)),
            "mean_abs_diff": float(d.mean()),
        }
    else:
        out |= {"max_abs_diff": None, "p99_abs_diff": None, "mean_abs_diff": None}
    out["mismatched"] = mismatches
    return out


def hit_rate(lists: Sequence[Sequence[str]], positives: Sequence[str | None]) -> float:
    """Share of users whose list holds their held-out item."""
    if not lists:
        return 0.0
    return round(sum(p in lst for lst, p in zip(lists, positives, strict=True)) / len(lists), 6)


def cascade_report(
    cases: Sequence[Case],
    replayed: Replayed,
    expected: Lists,
    fp32: Lists,
    *,
    tolerance: float,
    top_k: int,
) -> dict[str, Any]:
    """The replies set against the offline cascade: coverage, same lists, score differences,
    hit rate; and the offline fp32 pass against the artifact's file (it must reproduce it)."""
    results = replayed.results
    answered = [r for r in results if r is not None]
    positives = [c.positive for c in cases]
    got = compare_lists(expected, results)
    shown = [
        {"user_id": cases[u].user_id, "offline": list(expected[0][u]),
         "online": list(results[u].items), "online_scores": list(results[u].scores),
         "offline_scores": list(expected[1][u])}
        for u in got.pop("mismatched")[:SHOWN_MISMATCHES]
    ]  # fmt: skip
    fp32_replies = [_Reply(i, s) for i, s in zip(*fp32, strict=True)]
    file_lists: Lists = ([c.items for c in cases], [c.file_scores for c in cases])
    file_check = compare_lists(file_lists, fp32_replies)
    encoded_check = compare_lists(expected, fp32_replies)
    online_lists = [r.items if r is not None else () for r in results]
    hr = f"hr@{top_k}"
    return {
        "users": len(cases),
        "events_replayed": replayed.events,
        "requests": len(cases),
        "answered": len(answered),
        "degraded": sum(1 for r in answered if r.degraded),
        "reasons": sorted({r.reason for r in answered if r.reason}),
        "cached": sum(1 for r in answered if r.cached),
        "versions_served": sorted({r.model_version for r in answered}),
        **got,
        "tolerance": tolerance,
        "mismatches": shown,
        hr: {
            "offline": hit_rate(expected[0], positives),
            "online": hit_rate(online_lists, positives),
            "offline_fp32": hit_rate(fp32[0], positives),
        },
        "offline_fp32_vs_artifact": {k: file_check[k] for k in ("same_items", "max_abs_diff")},
        "offline_vs_offline_fp32": {"same_items": encoded_check["same_items"]},
        "client_latency_ms": {
            "p50": _pct(replayed.latencies, 50),
            "p99": _pct(replayed.latencies, 99),
        },
    }


class _Reply:
    """Items and scores in the shape of a reply (to compare two offline passes)."""

    def __init__(self, items: Sequence[str], scores: Sequence[float]) -> None:
        self.items, self.scores = items, scores


def _pct(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def consistent(report: dict[str, Any], *, cases: int, version: str) -> bool:
    """Every user answered, none degraded or cached, all by ``version``, the same items in the
    same order as offline, scores within the tolerance, the same hit rate."""
    hits = next(v for k, v in report.items() if k.startswith("hr@"))
    return bool(
        cases
        and report["answered"] == cases
        and report["degraded"] == 0
        and report["cached"] == 0
        and report["versions_served"] == [version]
        and report["same_items"] == cases
        and report["max_abs_diff"] is not None
        and report["max_abs_diff"] <= report["tolerance"]
        and hits["online"] == hits["offline"]
    )
