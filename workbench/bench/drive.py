"""``streamrank bench drive``: steady load from a process of its own, with a record of
everything, so that a fault test (or the soak) can account for every message.

Clicks and rank requests at fixed offered rates (open loop: never slowed by the workers), like
upstream services that retry: a send that fails is sent again, the same message (same
event_id / request_id), until the broker acknowledges it. Replies are read from the end of the
results topic, every partition, by one assigned consumer.

What it writes under ``--records`` (read back with :func:`load_run`):

* ``clicks.jsonl``: ``{"event_id", "user_id", "item_id", "ts", "attempts"}`` per acknowledged
  click;
* ``requests.jsonl``: ``{"request_id", "user_id", "sent_ms", "attempts"}`` per acknowledged
  request (``sent_ms`` = epoch ms of the first send);
* ``replies.jsonl``: ``{"request_id", "received_ms", "latency_ms", "degraded", "reason",
  "model_version", "served_at", "timings_ms"}`` per reply received, duplicates included;
* ``progress.json``: counts, rewritten every second while it runs.

It stops after ``--seconds`` or on SIGTERM/SIGINT: no new sends, every pending send is
acknowledged, then replies are awaited for up to ``--drain-s``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from streamrank import clock
from streamrank.kafka import clients as kafka
from streamrank.kafka.fetch_wait import FetchWait
from streamrank.runtime.tasks import cancel_and_wait
from streamrank.settings import Settings

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--records", type=Path, required=True, help="directory for the records (created)"
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to send")
    parser.add_argument("--click-rate", type=float, default=50.0, help="clicks per second")
    parser.add_argument("--request-rate", type=float, default=50.0, help="requests per second")
    parser.add_argument("--users", type=int, default=40, help="distinct users")
    parser.add_argument("--candidates", type=int, default=10, help="items per request")
    parser.add_argument(
        "--item-file", type=Path, help="item ids, one per line (default: i0 ... i999)"
    )
    parser.add_argument("--tag", default="", help="prefix of every id (default: random)")
    parser.add_argument(
        "--deadline-ms", type=int, help="deadline budget per request (default: the worker's)"
    )
    parser.add_argument("--drain-s", type=float, default=60.0, help="how long to wait for replies")
    parser.add_argument("--seed", type=int, default=1)


@dataclass
class Outbox:
    """What was sent and acknowledged, and what is waiting to be sent again."""

    clicks: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    replies: list[dict[str, Any]] = field(default_factory=list)
    retry: asyncio.Queue[tuple[str, bytes, bytes, dict[str, Any]]] = field(
        default_factory=asyncio.Queue
    )
    pending: set[asyncio.Future[Any]] = field(default_factory=set)
    failed_sends: int = 0
    outstanding: int = 0  # offered, not yet acknowledged (in flight or waiting to be re-sent)
    settled: asyncio.Event = field(default_factory=asyncio.Event)


class LoadDriver:
    """The load of one run; ``await LoadDriver(...).run()`` returns the summary."""

    def __init__(self, *, settings: Settings, args: argparse.Namespace) -> None:
        self.settings = settings
        self.args = args
        self.tag = args.tag or uuid.uuid4().hex[:8]
        self.out = Outbox()
        self.stop = asyncio.Event()
        self._rng = np.random.default_rng(args.seed)
        self._items = self._item_ids(args.item_file)
        self._users = [f"{self.tag}-u{k}" for k in range(args.users)]
        self._sent_at: dict[str, float] = {}  # request_id -> perf_counter of the first send
        self._producer: AIOKafkaProducer | None = None

    @staticmethod
    def _item_ids(path: Path | None) -> list[str]:
        if path is None:
            return [f"i{n}" for n in range(1000)]
        items = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        if not items:
            raise ValueError(f"{path} holds no item ids")
        return items

    # --- messages -----------------------------------------------------------------------------

    def _click(self, n: int) -> tuple[str, bytes, bytes, dict[str, Any]]:
        user = self._users[int(self._rng.integers(len(self._users)))]
        item = self._items[int(self._rng.integers(len(self._items)))]
        record = {"event_id": f"{self.tag}-c{n}", "user_id": user, "item_id": item,
                  "ts": clock.now_ms(), "attempts": 0}  # fmt: skip
        value = orjson.dumps({k: record[k] for k in ("event_id", "user_id", "item_id", "ts")})
        return self.settings.topics.clicks, user.encode(), value, record

    def _request(self, n: int) -> tuple[str, bytes, bytes, dict[str, Any]]:
        user = self._users[int(self._rng.integers(len(self._users)))]
        k = min(self.args.candidates, len(self._items))
        picks = self._rng.choice(len(self._items), size=k, replace=False)
        request_id = f"{self.tag}-r{n}"
        body: dict[str, Any] = {"request_id": request_id, "user_id": user,
                                "items": [self._items[int(i)] for i in picks]}  # fmt: skip
        if self.args.deadline_ms is not None:
            body["deadline_ms"] = clock.now_ms() + self.args.deadline_ms
        record = {"request_id": request_id, "user_id": user, "sent_ms": clock.now_ms(),
                  "attempts": 0}  # fmt: skip
        return self.settings.topics.requests, user.encode(), orjson.dumps(body), record

    # --- sending ------------------------------------------------------------------------------

    async def _offer_one(self, message: tuple[str, bytes, bytes, dict[str, Any]]) -> None:
        self.out.outstanding += 1
        self.out.settled.clear()
        await self._send(message)

    async def _send(self, message: tuple[str, bytes, bytes, dict[str, Any]]) -> None:
        assert self._producer is not None
        topic, key, value, record = message
        record["attempts"] += 1
        if "request_id" in record:
            self._sent_at.setdefault(record["request_id"], time.perf_counter())
        try:
            future = await self._producer.send(topic, value, key=key)
        except KafkaError as exc:
            self._failed(message, exc)
            return
        self.out.pending.add(future)

        def done(f: asyncio.Future[Any]) -> None:
            self.out.pending.discard(f)
            if f.cancelled() or f.exception() is not None:
                self._failed(message, f.exception() if not f.cancelled() else None)
                return
            (self.out.clicks if topic == self.settings.topics.clicks else self.out.requests).append(
                record
            )
            self.out.outstanding -= 1
            if self.out.outstanding == 0:
                self.out.settled.set()

        future.add_done_callback(done)

    def _failed(self, message: tuple[str, bytes, bytes, dict[str, Any]], exc: Any) -> None:
        self.out.failed_sends += 1
        if self.out.failed_sends <= 5:
            logger.warning("a send failed (%s); sending it again", exc)
        self.out.retry.put_nowait(message)

    async def _resend(self) -> None:
        while True:
            message = await self.out.retry.get()
            await asyncio.sleep(0.5)  # back-off: the broker did not take it a moment ago
            await self._send(message)

    async def _offer(self) -> None:
        """Both streams at their rates until ``stop`` or ``--seconds``."""
        args = self.args
        start = time.perf_counter()
        clicks = requests = 0
        while not self.stop.is_set():
            elapsed = time.perf_counter() - start
            if elapsed >= args.seconds:
                break
            while clicks < int(elapsed * args.click_rate):
                await self._offer_one(self._click(clicks))
                clicks += 1
            while requests < int(elapsed * args.request_rate):
                await self._offer_one(self._request(requests))
                requests += 1
            await asyncio.sleep(0.005)

    # --- replies ------------------------------------------------------------------------------

    async def _read_replies(self, consumer: Any) -> None:
        fetch = FetchWait(consumer, floor_ms=self.settings.scoring.fetch_wait_ms)
        while True:
            batches = await fetch.getmany(timeout_ms=200)
            now_perf, now_ms = time.perf_counter(), clock.now_ms()
            for records in batches.values():
                for record in records:
                    with contextlib.suppress(ValueError, TypeError):
                        reply = orjson.loads(record.value)
                        rid = reply["request_id"]
                        sent = self._sent_at.get(rid)
                        self.out.replies.append(
                            {"request_id": rid, "received_ms": now_ms,
                             "latency_ms": None if sent is None else (now_perf - sent) * 1000,
                             "degraded": bool(reply.get("degraded")),
                             "reason": reply.get("reason"),
                             "model_version": reply.get("model_version", ""),
                             "served_at": reply.get("served_at"),
                             "timings_ms": reply.get("timings_ms", {})}
                        )  # fmt: skip

    def answered(self) -> set[str]:
        return {r["request_id"] for r in self.out.replies}

    # --- the run ------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        s, args = self.settings, self.args
        args.records.mkdir(parents=True, exist_ok=True)
        self._producer = kafka.producer(s.kafka, acks="all", linger_ms=2)
        consumer = kafka.consumer(
            s.kafka, enable_auto_commit=False, fetch_max_wait_ms=s.scoring.fetch_wait_ms
        )
        await kafka.start_with_retry(
            s.kafka, [self._producer.start, consumer.start], what="load driver"
        )
        tasks: list[asyncio.Task[Any]] = []
        try:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(s.topics.results) or set()
            if not parts:
                raise SystemExit(f"the results topic {s.topics.results!r} does not exist")
            tps = [TopicPartition(s.topics.results, p) for p in sorted(parts)]
            consumer.assign(tps)
            await consumer.seek_to_end(*tps)
            for tp in tps:
                await consumer.position(tp)
            tasks = [asyncio.create_task(self._read_replies(consumer)),
                     asyncio.create_task(self._resend()),
                     asyncio.create_task(self._progress())]  # fmt: skip
            logger.info("load driver %s: %.0f clicks/s, %.0f requests/s for %.0fs",
                        self.tag, args.click_rate, args.request_rate, args.seconds)  # fmt: skip
            await self._offer()
            await self._settle()
            deadline = time.monotonic() + args.drain_s
            while time.monotonic() < deadline:
                if {r["request_id"] for r in self.out.requests} <= self.answered():
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # late duplicates
        finally:
            await cancel_and_wait(tasks, what="load driver")
            self._write()
            await consumer.stop()
            await self._producer.stop()
        return self.summary()

    async def _settle(self) -> None:
        """Until every send is acknowledged (re-sends included)."""
        if self.out.outstanding:
            await self.out.settled.wait()

    async def _progress(self) -> None:
        while True:
            self._write_progress()
            await asyncio.sleep(1.0)

    def _write_progress(self) -> None:
        progress = {"clicks": len(self.out.clicks), "requests": len(self.out.requests),
                    "replies": len(self.out.replies), "failed_sends": self.out.failed_sends,
                    "at_ms": clock.now_ms()}  # fmt: skip
        tmp = self.args.records / "progress.json.tmp"
        tmp.write_bytes(orjson.dumps(progress))
        tmp.replace(self.args.records / "progress.json")

    def _write(self) -> None:
        out = self.args.records
        for name, rows in (("clicks", self.out.clicks), ("requests", self.out.requests),
                           ("replies", self.out.replies)):  # fmt: skip
            (out / f"{name}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        self._write_progress()

    def summary(self) -> dict[str, Any]:
        run = Run(self.out.clicks, self.out.requests, self.out.replies)
        return {"tag": self.tag, "failed_sends": self.out.failed_sends, **run.summary()}


@dataclass
class Run:
    """The records of one driver run (see the module doc)."""

    clicks: list[dict[str, Any]]
    requests: list[dict[str, Any]]
    replies: list[dict[str, Any]]

    def first_replies(self) -> dict[str, dict[str, Any]]:
        """The first reply of each request."""
        out: dict[str, dict[str, Any]] = {}
        for reply in self.replies:
            out.setdefault(reply["request_id"], reply)
        return out

    def unanswered(self) -> list[str]:
        got = self.first_replies()
        return [r["request_id"] for r in self.requests if r["request_id"] not in got]

    def duplicates(self) -> int:
        """Replies beyond the first for a request (RankClient drops them)."""
        return len(self.replies) - len(self.first_replies())

    def degraded(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(request, first reply) of each request answered degraded."""
        got = self.first_replies()
        return [(r, got[r["request_id"]]) for r in self.requests
                if r["request_id"] in got and got[r["request_id"]]["degraded"]]  # fmt: skip

    def reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _request, reply in self.degraded():
            counts[str(reply["reason"])] = counts.get(str(reply["reason"]), 0) + 1
        return dict(sorted(counts.items()))

    def latencies_ms(self, since_ms: int = 0, until_ms: int | None = None) -> np.ndarray:
        """Send-to-reply latency of the requests sent in ``[since_ms, until_ms)``."""
        got = self.first_replies()
        return np.array([got[r["request_id"]]["latency_ms"] for r in self.requests
                         if r["request_id"] in got and r["sent_ms"] >= since_ms
                         and (until_ms is None or r["sent_ms"] < until_ms)
                         and got[r["request_id"]]["latency_ms"] is not None],
                        dtype=np.float64)  # fmt: skip

    def percentiles_ms(self, since_ms: int = 0, until_ms: int | None = None) -> dict[str, float]:
        """``p50_ms`` and ``p99_ms`` of :meth:`latencies_ms` (empty when none came back)."""
        lat = self.latencies_ms(since_ms, until_ms)
        if not lat.size:
            return {}
        return {f"p{q}_ms": round(float(np.percentile(lat, q)), 2) for q in (50, 99)}

    def summary(self) -> dict[str, Any]:
        return {
            "clicks": len(self.clicks),
            "requests": len(self.requests),
            "replies": len(self.replies),
            "unanswered": len(self.unanswered()),
            "duplicate_replies": self.duplicates(),
            "degraded": len(self.degraded()),
            "reasons": self.reasons(),
            **self.percentiles_ms(),
        }


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if path.exists():
        for line in path.read_bytes().splitlines():
            if line.strip():
                yield orjson.loads(line)


def load_run(out: Path) -> Run:
    """The records a driver wrote under ``out``."""
    return Run(
        *(list(_read_jsonl(out / f"{name}.jsonl")) for name in ("clicks", "requests", "replies"))
    )


def per_user(clicks: Iterable[dict[str, Any]]) -> dict[str, set[str]]:
    """Event ids of the acknowledged clicks, per user (what Redis must hold, once each)."""
    out: dict[str, set[str]] = {}
    for click in clicks:
        out.setdefault(click["user_id"], set()).add(click["event_id"])
    return out


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        driver = LoadDriver(settings=settings, args=args)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, driver.stop.set)
        return await driver.run()

    return asyncio.run(main())
