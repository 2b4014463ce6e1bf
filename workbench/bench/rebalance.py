"""``streamrank bench rebalance``: what a consumer-group membership change costs.

Scoring: workers go 1 -> 2 -> 3 -> 2 in one group (and, last, one worker restarts) under a
constant open-loop request load, once with dynamic membership and once with static
membership (``kafka_group_instance_id`` per worker). For each change: the p99 and max reply
latency of the requests sent in the 10 s around it (2 s before, 8 s after), the longest gap
between two replies, and how the partitions are spread over the members once it settled
(from the group registry). Every request must be answered.

Features: 1 -> 2 workers under a constant click load; afterwards every click is in its user's
sequence and counted exactly once (sequence members and 1 h counters equal the clicks sent).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from schemas import ClickEvent
from streamrank import clock, keys
from streamrank.errors import StackError
from streamrank.kafka import clients as kafka
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streamrank.runtime import groups, tasks
from streamrank.settings import Settings
from workbench.bench.loadgen import Driver, encode, make_requests
from workbench.bench.scoring import bench_stack, publish_synthetic
from workbench.devstack.processes import WorkerProcess, start_worker

logger = logging.getLogger(__name__)

WINDOW_BEFORE_S, WINDOW_AFTER_S = 2.0, 8.0  # "the 10 s around" a membership change


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=50.0, help="rank requests per second")
    parser.add_argument("--phase-s", type=float, default=20.0, help="seconds between changes")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the topics")
    parser.add_argument(
        "--membership", default="dynamic,static", help="modes to run: dynamic, static or both"
    )
    parser.add_argument(
        "--session-timeout-ms", type=int, default=15_000,
        help="session timeout of every worker: static membership needs >= 10000 on Tansu, and "
        "longer than a worker restart",
    )  # fmt: skip
    parser.add_argument("--click-rate", type=float, default=500.0, help="clicks per second")
    parser.add_argument("--no-features", action="store_true", help="skip the features part")
    parser.add_argument("--items", type=int, default=2000, help="item table of the model")
    parser.add_argument(
        "--logs", type=Path, help="keep the workers' logs here (default: discarded)"
    )


def window_stats(
    sent: dict[str, float], got: dict[str, float], start: float, end: float
) -> dict[str, Any]:
    """Latency of the requests sent in ``[start, end)``, and the longest wait between two
    replies in that span (a pause of the whole group shows as one long gap)."""
    ids = [r for r, t in sent.items() if start <= t < end]
    answered = [r for r in ids if r in got]
    lat = np.array([(got[r] - sent[r]) * 1000 for r in answered])
    arrivals = np.sort(np.array([t for t in got.values() if start <= t < end]))
    gap = float(np.diff(arrivals).max() * 1000) if arrivals.size > 1 else None
    out: dict[str, Any] = {"sent": len(ids), "answered": len(answered)}
    if lat.size:
        out.update(p50_ms=round(float(np.percentile(lat, 50)), 1),
                   p99_ms=round(float(np.percentile(lat, 99)), 1),
                   max_ms=round(float(lat.max()), 1))  # fmt: skip
    out["longest_reply_gap_ms"] = None if gap is None else round(gap, 1)
    return out


def spread(members: list[groups.Member], topic: str) -> dict[str, list[int]]:
    return {m.member: [p for t, p in m.partitions if t == topic] for m in members}


def check_alive(workers: Mapping[str, WorkerProcess]) -> None:
    """A worker that exited makes the run meaningless: say which, and why (its log's end)."""
    for name, worker in workers.items():
        if not worker.alive():
            tail = "\n".join(worker.log_text().splitlines()[-15:])
            raise StackError(
                f"worker {name} ({worker.what}, pid {worker.pid}) exited with code "
                f"{worker.process.returncode} during the run; its log ends:\n{tail}"
            )


async def settled(settings: Settings, group: str, topic: str, *, members: int, partitions: int,
                  workers: Mapping[str, WorkerProcess], timeout_s: float = 90.0,
                  ) -> dict[str, list[int]]:  # fmt: skip
    """Until ``members`` registered members own all ``partitions`` once each, every member at
    least one (a member that just joined is registered with none until it is assigned)."""
    redis = redis_client(settings.redis)
    deadline = time.monotonic() + timeout_s
    last: dict[str, list[int]] = {}
    try:
        while time.monotonic() < deadline:
            check_alive(workers)
            last = spread(await groups.members(redis, group), topic)
            owned = sorted(p for ps in last.values() for p in ps)
            everyone = all(last.values()) or members > partitions
            if len(last) == members and owned == list(range(partitions)) and everyone:
                return last
            await asyncio.sleep(0.2)
    finally:
        await redis.aclose()
    raise StackError(
        f"group {group} did not settle on {members} members within {timeout_s:g} s: {last}; "
        "see the workers' logs (--logs DIR keeps them)"
    )


class Load:
    """Constant open-loop requests through a :class:`Driver` until stopped."""

    def __init__(
        self, driver: Driver, requests: list[tuple[str, str, list[str]]], rate: float
    ) -> None:
        self._driver, self._requests, self._rate = driver, requests, rate
        self._task: asyncio.Task[None] | None = None

    async def _send(self) -> None:
        far = clock.now_ms() + 3_600_000
        start = time.perf_counter()
        for i, (rid, user, items) in enumerate(self._requests):
            delay = start + i / self._rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._driver.send(rid, user, encode(rid, user, items, far))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        self._task = asyncio.create_task(self._send())
        try:
            yield
        finally:
            await tasks.cancel_and_wait([self._task], what="rebalance load")


@contextlib.contextmanager
def workers_stopped(handles: dict[str, WorkerProcess]) -> Iterator[None]:
    try:
        yield
    finally:
        for handle in handles.values():
            handle.stop()


class ScoringWorkers:
    """A scenario's scoring workers by name, each started and waited for until ready; with
    static membership each has a group instance id of its own name."""

    def __init__(self, settings: Settings, *, tag: str, static: bool, logs: Path) -> None:
        self._settings, self._tag, self._static, self._logs = settings, tag, static, logs
        self.handles: dict[str, WorkerProcess] = {}

    def start(self, name: str) -> None:
        s = self._settings
        extra = (
            {"STREAMRANK_KAFKA_GROUP_INSTANCE_ID": f"{s.scoring.group_id}-{name}"}
            if self._static
            else {}
        )
        self.handles[name] = start_worker(
            "scoring", s, log_path=self._logs / f"{self._tag}-{name}.log", metrics_port=0,
            extra_env=extra,
        )  # fmt: skip
        self.handles[name].wait_ready(180)

    def stop(self, name: str) -> None:
        self.handles.pop(name).stop()

    def restart(self, name: str) -> None:
        self.stop(name)
        self.start(name)


Change = tuple[str, float, int]  # (what, perf_counter when it began, members after)


async def scoring_scenario(
    base: Settings, args: argparse.Namespace, *, version: str, static: bool, logs: Path
) -> dict[str, Any]:
    tag = f"{'static' if static else 'dynamic'}-{uuid.uuid4().hex[:6]}"
    s = base.with_env(
        STREAMRANK_SCORING_GROUP_ID=f"rebalance-{tag}", STREAMRANK_TOPIC_REQUESTS=f"rb-requests-{tag}",
        STREAMRANK_TOPIC_RESULTS=f"rb-results-{tag}", STREAMRANK_CANARY_SPLIT=f"{version}:1",
        STREAMRANK_KAFKA_SESSION_TIMEOUT_MS=args.session_timeout_ms, STREAMRANK_KAFKA_HEARTBEAT_INTERVAL_MS=1000,
        STREAMRANK_SCORING_BUDGET_MS=60_000, STREAMRANK_METRICS_PORT=0,
    )  # fmt: skip
    await create_topics(s, partitions=args.partitions, topics=(s.topics.requests, s.topics.results))
    workers = ScoringWorkers(s, tag=tag, static=static, logs=logs)
    layouts: dict[str, dict[str, list[int]]] = {}
    total = int(args.rate * args.phase_s * 6 + args.rate * 60)
    requests = make_requests(
        n=total, users=500, n_items=args.items, candidates=20, zipf_a=1.1, seed=3
    )
    with workers_stopped(workers.handles):
        workers.start("w1")
        layouts["1 worker"] = await settled_scoring(s, args, workers, members=1)
        async with Driver(
            settings=s, requests_topic=s.topics.requests, results_topic=s.topics.results
        ) as driver:
            async with Load(driver, requests, args.rate).running():
                await asyncio.sleep(args.phase_s)
                steady = (time.perf_counter() - args.phase_s + 2, time.perf_counter())
                changes = await change_membership(s, args, workers, layouts)
            await driver.wait_answered(90)
            stats = driver.stats
    sent, got = stats.sent, stats.got
    return {
        "membership": "static" if static else "dynamic",
        "sent": len(sent),
        "answered": len(stats.answered()),
        "steady": window_stats(sent, got, *steady),
        "changes": {
            what: {
                **window_stats(sent, got, at - WINDOW_BEFORE_S, at + WINDOW_AFTER_S),
                "partitions": layouts[what],
            }
            for what, at, _members in changes
        },
        "partitions_1_worker": layouts["1 worker"],
    }


async def settled_scoring(
    s: Settings, args: argparse.Namespace, workers: ScoringWorkers, *, members: int
) -> dict[str, list[int]]:
    return await settled(
        s,
        s.scoring.group_id,
        s.topics.requests,
        members=members,
        partitions=args.partitions,
        workers=workers.handles,
    )


async def change_membership(
    s: Settings,
    args: argparse.Namespace,
    workers: ScoringWorkers,
    layouts: dict[str, dict[str, list[int]]],
) -> list[Change]:
    """1 -> 2 -> 3 -> 2 workers, then one restarted, ``args.phase_s`` apart; each change's
    partition layout once settled goes into ``layouts``."""
    changes: list[Change] = []
    plan: list[tuple[str, Callable[[], None], int]] = [
        ("join: 1 -> 2", lambda: workers.start("w2"), 2),
        ("join: 2 -> 3", lambda: workers.start("w3"), 3),
        ("leave: 3 -> 2", lambda: workers.stop("w3"), 2),
        ("restart: one of 2", lambda: workers.restart("w1"), 2),
    ]
    for what, action, members in plan:
        at = time.perf_counter()
        await asyncio.to_thread(action)
        changes.append((what, at, members))
        layouts[what] = await settled_scoring(s, args, workers, members=members)
        left = args.phase_s - (time.perf_counter() - at)
        if left > 0:
            await asyncio.sleep(left)
    return changes


async def features_scenario(
    base: Settings, args: argparse.Namespace, *, logs: Path
) -> dict[str, Any]:
    from streams.reader import FeatureReader
    from streams.windows import counted_from_ms, windows_from_settings

    tag = uuid.uuid4().hex[:6]
    s = base.with_env(
        STREAMRANK_FEATURES_APP_ID=f"rebalance-features-{tag}", STREAMRANK_TOPIC_CLICKS=f"rb-clicks-{tag}",
        STREAMRANK_TOPIC_DEAD_LETTERS=f"rb-dead-{tag}", STREAMRANK_SEQUENCE_LENGTH=100_000, STREAMRANK_METRICS_PORT=0,
        STREAMRANK_KAFKA_SESSION_TIMEOUT_MS=args.session_timeout_ms,
    )  # fmt: skip
    await create_topics(
        s, partitions=args.partitions, topics=(s.topics.clicks, s.topics.dead_letters)
    )
    users = [f"rb-{tag}-u{i}" for i in range(100)]
    handles: dict[str, WorkerProcess] = {}
    sent = 0
    producer = kafka.producer(s.kafka, acks="all", linger_ms=5)
    await producer.start()

    async def produce_for(seconds: float) -> None:
        nonlocal sent
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            due = int((time.monotonic() - start) * args.click_rate) - (sent - base_sent)
            for _ in range(max(0, due)):
                user = users[sent % len(users)]
                event = ClickEvent(f"{tag}-{sent}", user, f"i{sent % 50}", clock.now_ms())
                body = event.to_json()
                await producer.send(s.topics.clicks, body, key=user.encode())
                sent += 1
            await asyncio.sleep(0.02)

    try:
        with workers_stopped(handles):
            handles["w1"] = start_worker(
                "features", s, log_path=logs / f"features-{tag}-w1.log", metrics_port=0
            )
            await asyncio.to_thread(handles["w1"].wait_ready, 180)
            base_sent = 0
            await produce_for(args.phase_s / 2)
            handles["w2"] = start_worker(
                "features", s, log_path=logs / f"features-{tag}-w2.log", metrics_port=0
            )
            joined_at = sent
            base_sent = sent
            await produce_for(args.phase_s)
            await producer.flush()
            layout = await settled(
                s,
                s.features.app_id,
                s.topics.clicks,
                members=2,
                partitions=args.partitions,
                workers=handles,
            )
            redis = redis_client(s.redis)
            try:
                reader = FeatureReader(redis=redis, features=s.features)
                deadline = time.monotonic() + 120
                while True:
                    pipe = redis.pipeline(transaction=False)
                    for user in users:
                        pipe.zcard(keys.sequence(user))
                    in_sequences = sum(await pipe.execute())
                    if in_sequences >= sent or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.5)
                # as of the end of the current fine bucket: the run's clicks are all in
                fine, _coarse = windows_from_settings(s.features)
                as_of = counted_from_ms(clock.now_ms() + 1000, fine)
                counters = await reader.get_counters(user_ids=users, at_ms=as_of)
                counted = sum(c["clicks_1h"] for c in counters["users"].values())
            finally:
                await redis.aclose()
    finally:
        await producer.stop()
    return {"sent": sent, "sent_before_join": joined_at, "in_sequences": in_sequences,
            "counted_1h": counted, "partitions": layout}  # fmt: skip


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    modes = [m.strip() for m in args.membership.split(",") if m.strip()]
    with (
        bench_stack(settings) as (s, kind),
        tempfile.TemporaryDirectory(prefix="rebalance-") as tmp,
    ):
        work = Path(tmp)
        if args.logs is not None:
            work = args.logs
            work.mkdir(parents=True, exist_ok=True)
        return asyncio.run(_run(args, s, kind, modes, work))


async def _run(
    args: argparse.Namespace, s: Settings, kind: str, modes: list[str], work: Path
) -> dict[str, Any]:
    redis = redis_client(s.redis)
    version = f"bench-rb-{uuid.uuid4().hex[:6]}"
    try:
        await publish_synthetic(redis, n_items=args.items, seed=7, version=version, workdir=work)
    finally:
        await redis.aclose()
    out: dict[str, Any] = {"stack": kind, "rate": args.rate, "phase_s": args.phase_s,
                           "partitions": args.partitions, "session_timeout_ms": args.session_timeout_ms,
                           "window": f"requests sent {WINDOW_BEFORE_S:g} s before to {WINDOW_AFTER_S:g} s after each change"}  # fmt: skip
    out["scoring"] = [
        await scoring_scenario(s, args, version=version, static=mode == "static", logs=work)
        for mode in modes
    ]
    if not args.no_features:
        out["features"] = await features_scenario(s, args, logs=work)
    return out
