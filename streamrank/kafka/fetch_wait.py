"""A short fetch wait that never starves its consumer.

A short ``fetch_max_wait_ms`` bounds the latency per hop on a broker that holds every fetch for
its whole wait (the embedded Tansu). But a broker that needs longer than the wait to assemble a
fetch (Tansu, once it holds a lot of records, on a busy host) answers it empty although records
wait, every time: a consumer with such a wait then reads nothing, however far behind it is.
:class:`FetchWait` reads through ``getmany`` in short probes; when one returns nothing while
records wait (a partition's last known end ahead of its position) and none were read for
:data:`STALL_S`, it doubles the wait, and it halves the wait again, towards the configured one,
:data:`RELAX_AFTER_S` later (a raised wait costs latency: such a broker holds every fetch for
its whole wait). aiokafka takes each fetch request's wait from one private attribute of its fetcher;
this module is the only one that sets it (``pyproject.toml`` pins aiokafka's minor release).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

logger = logging.getLogger(__name__)

CEILING_MS = 500  # aiokafka's default wait: the most a starving consumer is raised to
STALL_S = 0.05  # records waiting and none read for this long (or 10 waits) is starving
RELAX_AFTER_S = 10.0  # a raised wait is halved after this long without starving
PROBE_ROUNDS = 5  # fetch waits per getmany probe (how often starving is looked for)

Batches = dict[TopicPartition, list[ConsumerRecord[Any, Any]]]


def stall_limit_s(wait_ms: int) -> float:
    """How long records may wait unread, at this fetch wait, before the consumer is starving."""
    return max(STALL_S, 10 * wait_ms / 1000)


def next_wait(wait_ms: int, *, floor_ms: int, starving: bool, now: float, changed_at: float) -> int:
    """The fetch wait after an observation at ``now``: doubled (up to :data:`CEILING_MS`) when
    ``starving`` (records waited unread for :func:`stall_limit_s`); halved towards
    ``floor_ms`` :data:`RELAX_AFTER_S` after the last change."""
    if starving:
        return min(CEILING_MS, max(2 * wait_ms, wait_ms + 1))
    if wait_ms > floor_ms and now - changed_at >= RELAX_AFTER_S:
        return max(floor_ms, wait_ms // 2)
    return wait_ms


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
        self.wait_ms = floor_ms
        self._read_at = self._changed_at = time.monotonic()
        self._listed_at = float("-inf")
        self._on_change = on_change
        if on_change is not None:
            on_change(floor_ms)

    async def getmany(self, *, timeout_ms: int, max_records: int | None = None) -> Batches:
        """What ``consumer.getmany`` returns within ``timeout_ms``, read in probes of
        :data:`PROBE_ROUNDS` fetch waits; the wait is adjusted after each."""
        self._read_at = time.monotonic()  # a stall counts from this call or the last read
        deadline = self._read_at + timeout_ms / 1000
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            probe_ms = min(left_ms, max(10, PROBE_ROUNDS * self.wait_ms))
            got = await self.consumer.getmany(timeout_ms=probe_ms, max_records=max_records)
            now = time.monotonic()
            if got:
                self._read_at = now
            stalled = now - max(self._read_at, self._changed_at) >= stall_limit_s(self.wait_ms)
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
        wait_ms = next_wait(
            self.wait_ms,
            floor_ms=self.floor_ms,
            starving=waiting > 0,
            now=now,
            changed_at=self._changed_at,
        )
        if wait_ms == self.wait_ms:
            return
        if wait_ms > self.wait_ms:
            logger.warning(
                "the broker answered fetches empty for %.0f ms although %d records wait; "
                "fetch wait raised from %d to %d ms (halved again after %.0f s)",
                1000 * (now - max(self._read_at, self._changed_at)),
                waiting,
                self.wait_ms,
                wait_ms,
                RELAX_AFTER_S,
            )
        else:
            logger.info("fetch wait lowered to %d ms", wait_ms)
        self.wait_ms, self._changed_at = wait_ms, now
        set_fetch_wait(self.consumer, wait_ms)
        if self._on_change is not None:
            self._on_change(wait_ms)
