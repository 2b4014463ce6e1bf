"""A short fetch wait that never starves its consumer.

A short ``fetch_max_wait_ms`` bounds the latency per hop on a broker that holds every fetch for
its whole wait (the embedded Tansu). But a broker that needs longer than the wait to assemble a
fetch (Tansu, once it holds a lot of records, on a busy host) answers it empty although records
wait, every time: a consumer with such a wait then reads nothing, however far behind it is.
:class:`FetchWait` reads through ``getmany`` in short probes; when records wait (a partition's
last known end ahead of its position) and none were read for :func:`stall_limit_s`, it doubles
the wait. A raised wait costs latency (such a broker holds every fetch for its whole wait), so
it is halved again towards the configured one :data:`RELAX_AFTER_S` later; when that starves at
once, the next try waits twice as long (up to :data:`MAX_RELAX_AFTER_S`). aiokafka takes each
fetch request's wait from one private attribute of its fetcher; this module is the only one
that sets it (``pyproject.toml`` pins aiokafka's minor release).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

logger = logging.getLogger(__name__)

CEILING_MS = 500  # aiokafka's default wait: the most a starving consumer is raised to
STALL_S = 0.03  # records waiting and none read for this long (or 10 waits) is starving
RELAX_AFTER_S = 10.0  # a raised wait is first halved after this long without starving
MAX_RELAX_AFTER_S = 600.0  # the longest a raised wait holds before it is tried lower again
PROBE_ROUNDS = 5  # fetch waits per getmany probe (how often starving is looked for)

Batches = dict[TopicPartition, list[ConsumerRecord[Any, Any]]]
Fetch = Callable[[int], Awaitable[Batches]]  # fetched records within a timeout in ms


def stall_limit_s(wait_ms: int) -> float:
    """How long records may wait unread, at this fetch wait, before the consumer is starving."""
    return max(STALL_S, 10 * wait_ms / 1000)


@dataclass(frozen=True, slots=True)
class Wait:
    """A consumer's fetch wait: since when, how long it holds before it is tried lower, and
    whether it was lowered (a lowered wait that starves makes the next try wait longer)."""

    wait_ms: int
    changed_at: float
    relax_after_s: float = RELAX_AFTER_S
    lowered: bool = False


def next_wait(wait: Wait, *, floor_ms: int, starving: bool, now: float) -> Wait:
    """The fetch wait after an observation at ``now``: doubled (up to :data:`CEILING_MS`) when
    ``starving``; halved towards ``floor_ms`` once it has held for ``relax_after_s``."""
    if starving:
        relax_after_s = wait.relax_after_s
        if wait.lowered:  # the lower wait starves: hold the higher one twice as long next time
            relax_after_s = min(MAX_RELAX_AFTER_S, 2 * relax_after_s)
        raised = min(CEILING_MS, max(2 * wait.wait_ms, wait.wait_ms + 1))
        return Wait(raised, now, relax_after_s, lowered=False)
    if wait.wait_ms > floor_ms and now - wait.changed_at >= wait.relax_after_s:
        return dataclasses.replace(
            wait, wait_ms=max(floor_ms, wait.wait_ms // 2), changed_at=now, lowered=True
        )
    return wait


def waiting_records(ends: dict[TopicPartition, int], positions: dict[TopicPartition, int]) -> int:
    """Records between each partition's position and its last known end (0 where unknown)."""
    return sum(max(0, end - positions[tp]) for tp, end in ends.items() if tp in positions)


def set_fetch_wait(consumer: AIOKafkaConsumer, wait_ms: int) -> None:
    """The wait of the consumer's next fetch requests (the fenced private attributes: the
    consumer's, which a fetcher started later copies, and the running fetcher's)."""
    consumer._fetch_max_wait_ms = wait_ms
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is not None:
        fetcher._fetch_max_wait_ms = wait_ms


class FetchWait:
    """``await FetchWait(consumer, floor_ms=2).getmany(timeout_ms=200)``: ``consumer.getmany``
    with the consumer's fetch wait kept as short as the broker allows."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        *,
        floor_ms: int,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        self.consumer = consumer
        self.floor_ms = floor_ms
        self._wait = Wait(floor_ms, changed_at=time.monotonic())
        self._read_at = self._wait.changed_at
        self._highest_ms = floor_ms
        self._listed_at = float("-inf")
        self._on_change = on_change
        if on_change is not None:
            on_change(floor_ms)

    @property
    def wait_ms(self) -> int:
        """The wait the consumer's fetches ask for now."""
        return self._wait.wait_ms

    async def getmany(self, *, timeout_ms: int, max_records: int | None = None) -> Batches:
        """What ``consumer.getmany`` returns within ``timeout_ms``, read in probes of
        :data:`PROBE_ROUNDS` fetch waits; the wait is adjusted after each."""

        def fetch(probe_ms: int) -> Awaitable[Batches]:
            return self.consumer.getmany(timeout_ms=probe_ms, max_records=max_records)

        return await self.read(fetch, timeout_ms=timeout_ms)

    async def read(self, fetch: Fetch, *, timeout_ms: int) -> Batches:
        """What ``fetch(probe_ms)`` (a read of the consumer's fetched records within
        ``probe_ms``: ``getmany``, or a framework's own) returns within ``timeout_ms``."""
        self._read_at = time.monotonic()  # a stall counts from this call or the last read
        deadline = self._read_at + timeout_ms / 1000
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            probe_ms = min(left_ms, max(10, PROBE_ROUNDS * self.wait_ms))
            got = await fetch(probe_ms)
            now = time.monotonic()
            stalled = now - max(self._read_at, self._wait.changed_at) >= stall_limit_s(self.wait_ms)
            if stalled and not got:  # records that arrived as the probe timed out are not a stall
                got = await fetch(0)
            if got:
                self._read_at = now
            self._observe(now, waiting=await self._waiting() if stalled and not got else 0)
            if got or now >= deadline:
                return got

    async def _waiting(self) -> int:
        """Records the broker holds for the unpaused assigned partitions beyond their positions:
        their last known ends (a broker that answers empty may not say: then asked, at most
        once a second), less a rebalance in between."""
        consumer = self.consumer
        ends: dict[TopicPartition, int] = {}
        positions: dict[TopicPartition, int] = {}
        unknown: list[TopicPartition] = []
        for tp in consumer.assignment() - consumer.paused():
            with contextlib.suppress(IllegalStateError, AssertionError):  # revoked meanwhile
                positions[tp] = await consumer.position(tp)
                high, stable = consumer.highwater(tp), consumer.last_stable_offset(tp)
                if high is None:
                    unknown.append(tp)
                else:
                    ends[tp] = min(high, stable) if stable is not None and stable >= 0 else high
        now = time.monotonic()
        if unknown and now - self._listed_at >= 1.0:
            self._listed_at = now
            with contextlib.suppress(KafkaError):  # unreachable: nothing known to wait
                ends.update(await consumer.end_offsets(unknown))
        return waiting_records(ends, positions)

    def _observe(self, now: float, *, waiting: int) -> None:
        before = self._wait
        self._wait = next_wait(before, floor_ms=self.floor_ms, starving=waiting > 0, now=now)
        if self._wait.wait_ms == before.wait_ms:
            return
        if self._wait.wait_ms > before.wait_ms:
            # Warn at a new high; a raise back to a wait already needed once is routine.
            level = logging.WARNING if self._wait.wait_ms > self._highest_ms else logging.INFO
            self._highest_ms = max(self._highest_ms, self._wait.wait_ms)
            logger.log(
                level,
                "the broker answered fetches empty for %.0f ms although %d records wait; "
                "fetch wait raised from %d to %d ms (tried lower again after %.0f s)",
                1000 * (now - max(self._read_at, before.changed_at)),
                waiting,
                before.wait_ms,
                self._wait.wait_ms,
                self._wait.relax_after_s,
            )
        else:
            logger.info("fetch wait lowered to %d ms", self._wait.wait_ms)
        set_fetch_wait(self.consumer, self._wait.wait_ms)
        if self._on_change is not None:
            self._on_change(self._wait.wait_ms)
