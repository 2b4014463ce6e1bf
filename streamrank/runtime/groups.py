"""Who owns which partition: consumer-group members as they report themselves, in Redis.

A real Kafka broker answers DescribeGroups with each member's client id, host and assignment,
and ``streamrank lag`` reads that. Some brokers leave those fields empty (the embedded Tansu
broker returns only member ids), so each worker also publishes its own assignment from its
rebalance callbacks: one field of ``keys.group_members(group)`` per member, re-written every
``REFRESH_S`` seconds while the worker runs, so a member that is gone expires (``TTL_S``) and
a stopped worker deletes its own entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from streamrank import clock, keys
from streamrank.redis.errors import TRANSIENT, redis_call

logger = logging.getLogger(__name__)

TTL_S = 30.0  # a member silent this long is dropped from the registry
REFRESH_S = 5.0  # how often a running member re-writes its entry


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a consumer group and the partitions it owns."""

    member: str  # the client id (or the static group_instance_id) it joined with
    host: str
    pid: int | None
    partitions: tuple[tuple[str, int], ...]  # (topic, partition), sorted
    since: int  # epoch ms when it got this assignment (0: unknown)
    kind: str = ""  # features or scoring (empty when the broker reported it)

    def to_json(self, *, expires: int) -> bytes:
        return orjson.dumps(
            {
                "member": self.member,
                "host": self.host,
                "pid": self.pid,
                "partitions": [list(tp) for tp in self.partitions],
                "since": self.since,
                "kind": self.kind,
                "expires": expires,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> tuple[Member, int]:
        """The member and when its entry expires (epoch ms); ValueError when unreadable."""
        try:
            d = orjson.loads(raw)
            return (
                cls(
                    member=str(d["member"]),
                    host=str(d["host"]),
                    pid=int(d["pid"]) if d.get("pid") is not None else None,
                    partitions=tuple(sorted((str(t), int(p)) for t, p in d["partitions"])),
                    since=int(d.get("since") or 0),
                    kind=str(d.get("kind") or ""),
                ),
                int(d["expires"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"unreadable group member entry: {exc}") from None


def client_id(kind: str, instance_id: str | None = None) -> str:
    """The Kafka client id a worker joins with: its static instance id when it has one, else
    kind, host and pid, so the broker's and our registry's member lists name the same thing."""
    return instance_id or f"streamrank-{kind}-{socket.gethostname()}-{os.getpid()}"


async def publish(redis: Any, group: str, member: Member, *, ttl_s: float = TTL_S) -> None:
    """Write (or refresh) ``member``'s entry, valid for ``ttl_s``. The key itself lives
    ``TTL_S`` (at least) past the last write of any member, so a group whose workers are all
    gone leaves nothing behind."""
    expires = clock.now_ms() + int(ttl_s * 1000)
    key = keys.group_members(group)
    with redis_call(f"publishing the assignment of {member.member} in group {group}"):
        pipe = redis.pipeline(transaction=False)
        pipe.hset(key, member.member, member.to_json(expires=expires))
        pipe.pexpire(key, int(max(ttl_s, TTL_S) * 1000))
        await pipe.execute()


async def withdraw(redis: Any, group: str, member: str) -> None:
    """Delete a stopping member's entry."""
    with redis_call(f"withdrawing {member} from group {group}"):
        await redis.hdel(keys.group_members(group), member)


async def members(redis: Any, group: str) -> list[Member]:
    """The live members of ``group`` (expired and unreadable entries are dropped and deleted)."""
    key = keys.group_members(group)
    with redis_call(f"reading the members of group {group}"):
        raw = await redis.hgetall(key)
    now = clock.now_ms()
    live: list[Member] = []
    stale: list[Any] = []
    for name, value in raw.items():
        try:
            member, expires = Member.from_json(value)
        except ValueError as exc:
            logger.warning("group %s: dropping entry %r: %s", group, name, exc)
            stale.append(name)
            continue
        if expires < now:
            stale.append(name)
        else:
            live.append(member)
    if stale:
        with contextlib.suppress(*TRANSIENT):
            await redis.hdel(key, *stale)
    return sorted(live, key=lambda m: m.member)


def owners(group_members: Iterable[Member]) -> dict[tuple[str, int], Member]:
    """Partition -> the member that owns it. While a rebalance is in progress two entries can
    claim one partition: the newer assignment wins."""
    out: dict[tuple[str, int], Member] = {}
    for member in sorted(group_members, key=lambda m: m.since):
        for tp in member.partitions:
            out[tp] = member
    return out


@dataclass
class Registration:
    """A running worker's entry: :meth:`assigned` from its rebalance callback, :meth:`run` as a
    task of its event loop (refreshes the entry), :meth:`withdraw` when it stops."""

    redis: Any
    group: str
    member: str
    kind: str
    partitions: tuple[tuple[str, int], ...] = ()
    since: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def assigned(self, partitions: Iterable[tuple[str, int]]) -> None:
        """The worker's partitions now (called from the rebalance callback: no I/O here)."""
        self.partitions = tuple(sorted(partitions))
        self.since = clock.now_ms()
        self._changed.set()

    def snapshot(self) -> Member:
        return Member(
            self.member, socket.gethostname(), os.getpid(), self.partitions, self.since, self.kind
        )

    async def run(self, *, refresh_s: float = REFRESH_S) -> None:
        """Publish at once after each assignment and every ``refresh_s``; Redis being down is
        logged once and retried (ops lose the owner column meanwhile, nothing else)."""
        failing = False
        while True:
            self._changed.clear()
            try:
                await publish(self.redis, self.group, self.snapshot())
                if failing:
                    logger.info("group registry: publishing the assignment again")
                failing = False
            except Exception as exc:
                if not failing:
                    logger.warning("group registry: cannot publish the assignment (%s)", exc)
                failing = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(refresh_s):  # not wait_for: see streamrank.runtime.tasks
                    await self._changed.wait()

    async def withdraw(self) -> None:
        try:
            await withdraw(self.redis, self.group, self.member)
        except Exception as exc:  # stopping anyway: the entry expires by itself
            logger.warning("group registry: could not withdraw %s (%s)", self.member, exc)
