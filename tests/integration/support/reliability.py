"""The rig of the fault tests: workers as real processes on the test broker and a private Redis
(append-only, so a killed Redis comes back with its data), steady load from the load driver
(``streamrank bench drive``, a process of its own), and the accounting of every message."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis

from streamrank import keys
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from streams.reader import FeatureReader
from tests.integration.support.features import counted_at
from tests.integration.support.scoring import item_ids, publish
from workbench.bench.drive import Run, load_run, per_user
from workbench.devstack.processes import (
    ChildProcess,
    WorkerProcess,
    start_command,
    start_worker,
)
from workbench.devstack.servers import RedisServer


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Rig:
    """Settings on the test broker and a private Redis; every process it starts is stopped
    at the end (:meth:`close`)."""

    settings: Settings
    redis: RedisServer
    tmp: Path
    artifact: Path
    children: list[ChildProcess] = field(default_factory=list)
    driver: ChildProcess | None = None

    def with_settings(self, **update: Any) -> Settings:
        return self.settings.with_env(**update)

    async def prepare(self) -> None:
        """Topics, and the tiny model published and active in the private Redis."""
        await create_topics(self.settings)
        client = aioredis.from_url(self.redis.url)
        try:
            version = await publish(client, self.artifact)
            await client.set(keys.active_model(), version)
        finally:
            await client.aclose()

    def worker(
        self, kind: str, name: str, *, settings: Settings | None = None, ready: bool = True
    ) -> WorkerProcess:
        worker = start_worker(
            kind, settings or self.settings, log_path=self.tmp / f"{name}.log", metrics_port=0
        )
        self.children.append(worker)
        if ready:
            worker.wait_ready(120)
        return worker

    def drive(
        self,
        *,
        seconds: float,
        click_rate: float = 0.0,
        request_rate: float = 0.0,
        users: int = 40,
        candidates: int = 10,
        drain_s: float = 90.0,
        extra: Sequence[str] = (),
    ) -> ChildProcess:
        """Start the load driver; its records go to ``tmp/run``."""
        items = self.tmp / "items.txt"
        items.write_text("\n".join(item_ids(self.artifact)[:200]) + "\n")
        args = ["bench", "drive", "--json", "--records", str(self.tmp / "run"),
                "--seconds", str(seconds), "--click-rate", str(click_rate),
                "--request-rate", str(request_rate), "--users", str(users),
                "--candidates", str(candidates), "--item-file", str(items),
                "--drain-s", str(drain_s), *extra]  # fmt: skip
        self.driver = start_command(
            args, self.settings, log_path=self.tmp / "driver.log", what="load driver"
        )
        self.children.append(self.driver)
        return self.driver

    def progress(self) -> dict[str, Any]:
        path = self.tmp / "run" / "progress.json"
        return orjson.loads(path.read_bytes()) if path.exists() else {}

    async def wait_flowing(self, *, replies: int = 50, timeout_s: float = 90.0) -> None:
        """Until the driver has ``replies`` replies (the workers answer under load)."""
        deadline = time.monotonic() + timeout_s
        while self.progress().get("replies", 0) < replies:
            assert self.driver is not None and self.driver.alive(), self.driver_log()
            assert time.monotonic() < deadline, f"no load flowing: {self.progress()}"
            await asyncio.sleep(0.2)

    async def finish(self, timeout_s: float = 240.0) -> Run:
        """Wait for the driver to end its run (replies drained); its records."""
        assert self.driver is not None
        deadline = time.monotonic() + timeout_s
        while self.driver.alive():
            assert time.monotonic() < deadline, "the load driver did not finish"
            await asyncio.sleep(0.2)
        assert self.driver.process.returncode == 0, self.driver_log()
        return load_run(self.tmp / "run")

    def driver_log(self) -> str:
        return self.driver.log_text()[-4000:] if self.driver is not None else ""

    def close(self) -> None:
        for child in reversed(self.children):
            with contextlib.suppress(Exception):
                child.stop(timeout_s=20)


@contextlib.contextmanager
def rig(
    make_settings: Callable[..., Settings],
    unique: str,
    tmp: Path,
    artifact: Path,
    **overrides: Any,
) -> Iterator[Rig]:
    """A private Redis (AOF) and settings with groups, topics and budgets of this test."""
    server = RedisServer(port=_free_port(), run_dir=tmp / "redis", persist="aof")
    server.start()
    base: dict[str, Any] = {
        "STREAMRANK_REDIS_URL": server.url,
        "STREAMRANK_SCORING_GROUP_ID": f"scoring-{unique}",
        "STREAMRANK_FEATURES_APP_ID": f"features-{unique}",
        # A loaded CI machine must not turn normal replies into "expired": only faults degrade.
        "STREAMRANK_SCORING_BUDGET_MS": 3000,
        "STREAMRANK_SCORING_POLL_S": 0.5,
        "STREAMRANK_SEQUENCE_LENGTH": 2000,  # every click of a run stays in its user's sequence
        "STREAMRANK_FEATURES_RETRY_MAX_S": 0.5,
        "STREAMRANK_BREAKER_COOLDOWN_S": 0.5,
    }
    base.update(overrides)
    the_rig = Rig(make_settings(**base), server, tmp, artifact)
    try:
        yield the_rig
    finally:
        the_rig.close()
        server.kill()


def _free_port() -> int:
    from workbench.devstack.services import free_port

    return free_port()


# --- accounting -------------------------------------------------------------------------------


async def redis_state(
    settings: Settings, users: Sequence[str]
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Per user: the event ids in the sequence, and the 1 h click counter."""
    client = redis_client(settings.redis, timeout_s=10)
    try:
        pipe = client.pipeline(transaction=False)
        for user in users:
            pipe.zrange(keys.sequence(user), 0, -1)
        members = await pipe.execute()
        # as of the end of the current fine bucket: every click made in the last 55 min is in
        as_of = counted_at(settings, int(time.time() * 1000) + 1000, "1h")
        counters = await FeatureReader(redis=client, features=settings.features).get_counters(
            user_ids=users, at_ms=as_of
        )
    finally:
        await client.aclose()
    sequences = {u: [m.decode().split(keys.FIELD_SEP)[0] for m in ms]
                 for u, ms in zip(users, members, strict=True)}  # fmt: skip
    return sequences, {u: c["clicks_1h"] for u, c in counters["users"].items()}


async def assert_clicks_applied_once(
    settings: Settings, run: Run, *, timeout_s: float = 60
) -> None:
    """Every acknowledged click is in its user's sequence once and counted once; nothing else
    is (the features worker may still be catching up: polled until ``timeout_s``)."""
    expected = per_user(run.clicks)
    assert expected, "the run produced no clicks"
    deadline = time.monotonic() + timeout_s
    while True:
        sequences, counters = await redis_state(settings, sorted(expected))
        if (
            all(len(sequences[u]) >= len(e) for u, e in expected.items())
            or time.monotonic() > deadline
        ):
            break
        await asyncio.sleep(0.5)
    lost = {u: sorted(e - set(sequences[u])) for u, e in expected.items() if e - set(sequences[u])}
    assert not lost, f"clicks lost: {sum(map(len, lost.values()))} ({list(lost.items())[:3]})"
    for user, events in expected.items():
        assert sorted(sequences[user]) == sorted(events), f"{user}: sequence differs"
        assert counters[user] == len(events), (
            f"{user}: counted {counters[user]}, produced {len(events)}"
        )


def assert_all_answered(run: Run) -> None:
    unanswered = run.unanswered()
    assert run.requests, "the run sent no requests"
    assert not unanswered, f"{len(unanswered)} of {len(run.requests)} unanswered: {unanswered[:5]}"


def assert_degraded_only_within(
    run: Run, windows: Sequence[tuple[int, int]], *, reasons: set[str]
) -> None:
    """Every degraded reply answers a request sent inside one of ``windows`` (epoch ms) and
    carries one of ``reasons``."""
    outside = [(r["request_id"], r["sent_ms"], reply["reason"]) for r, reply in run.degraded()
               if not any(lo <= r["sent_ms"] <= hi for lo, hi in windows)]  # fmt: skip
    assert not outside, f"{len(outside)} degraded outside the fault {windows}: {outside[:5]}"
    assert set(run.reasons()) <= reasons, run.reasons()


def assert_alive(*workers: WorkerProcess) -> None:
    for worker in workers:
        assert worker.alive(), f"{worker.what} died:\n{worker.log_text()[-3000:]}"
        assert "Traceback" not in worker.log_text(), worker.log_text()[-3000:]


def report(
    fault: str, run: Run, *, start_ms: int, end_ms: int, dead_lettered: int = 0, **extra: Any
) -> dict[str, Any]:
    """One row of the fault table of docs/reliability.md, printed (``pytest -s``) and appended
    to ``$STREAMRANK_RELIABILITY_REPORT`` when set. Recovery: from the end of the fault to the
    last request (by send time) answered degraded."""
    degraded = run.degraded()
    last = max((r["sent_ms"] for r, _reply in degraded), default=None)
    row = {
        "fault": fault,
        "clicks": len(run.clicks),
        "requests": len(run.requests),
        "answered": len(run.first_replies()),
        "dead_lettered": dead_lettered,
        "duplicate_replies": run.duplicates(),
        "lost": len(run.unanswered()),
        "degraded": len(degraded),
        "reasons": run.reasons(),
        "fault_s": round((end_ms - start_ms) / 1000, 1),
        "recovery_s": None if last is None else round(max(0, last - end_ms) / 1000, 1),
        **extra,
    }
    line = orjson.dumps(row).decode()
    print(f"\nRELIABILITY {line}")
    target = os.environ.get("STREAMRANK_RELIABILITY_REPORT")
    if target:
        with open(target, "a") as out:
            out.write(line + "\n")
    return row
