"""``streamrank lag``: how far each consumer group is behind, per partition, and who owns it.

Lag = the partition's end offset (high watermark) minus the group's committed offset: the
number of records the group has not yet committed. It is what ops watch when deciding to add
workers (up to the topic's partition count).

The owner of each partition comes from the broker's DescribeGroups when it carries the
members' assignments (Apache Kafka does), else from the group registry the workers write to
Redis (:mod:`streamrank.runtime.groups`; the embedded Tansu broker answers DescribeGroups with member
ids only). :attr:`GroupLag.owners_from` says which.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import KafkaConnectionError, KafkaError

from streamrank.errors import KafkaUnavailable
from streamrank.kafka import clients as kafka
from streamrank.redis.client import redis_client
from streamrank.redis.errors import TRANSIENT
from streamrank.runtime import groups
from streamrank.settings import Settings

logger = logging.getLogger(__name__)

OwnersFrom = Literal["broker", "registry", "none"]


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    end_offset: int
    committed: int | None  # None: the group has committed nothing on this partition yet
    owner: str | None = None  # the member (client id) that owns it now
    host: str | None = None

    @property
    def lag(self) -> int:
        return self.end_offset - (self.committed or 0)


@dataclass(frozen=True, slots=True)
class GroupLag:
    """One group on one topic: per-partition lag and owners, and the members."""

    group: str
    topic: str
    state: str  # the broker's group state (Stable, Empty, PreparingRebalance, ... or Dead)
    rows: list[PartitionLag]
    members: list[groups.Member] = field(default_factory=list)
    owners_from: OwnersFrom = "none"
    note: str = ""  # why owners are missing, when they are


def summarise(rows: list[PartitionLag]) -> dict[str, Any]:
    """Totals and per-partition rows, as printed by ``streamrank lag --json``."""
    return {
        "total_lag": sum(r.lag for r in rows),
        "partitions": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "end_offset": r.end_offset,
                "committed": r.committed,
                "lag": r.lag,
                "owner": r.owner,
                "host": r.host,
            }
            for r in sorted(rows, key=lambda r: (r.topic, r.partition))
        ],
    }


def report(info: GroupLag) -> dict[str, Any]:
    """One group as ``streamrank lag --json`` prints it."""
    return {
        "group": info.group,
        "topic": info.topic,
        "state": info.state,
        "owners_from": info.owners_from,
        **({"note": info.note} if info.note else {}),
        "members": [
            {
                "member": m.member,
                "host": m.host,
                "pid": m.pid,
                "partitions": [p for t, p in m.partitions if t == info.topic],
                "since": m.since or None,
            }
            for m in info.members
        ],
        **summarise(info.rows),
    }


def broker_members(described: Any) -> tuple[str, list[groups.Member]]:
    """The state and members of one DescribeGroups response group; members whose assignment
    the broker left empty get no partitions."""
    error, _gid, state, _ptype, _protocol, members, *_ = described
    if error:
        return "Dead", []
    out = []
    for m in members:
        # v0-3: (member_id, client_id, host, metadata, assignment); v4+ adds group_instance_id
        member_id, client_id, host, assignment = m[0], m[-4], m[-3], m[-1]
        partitions: tuple[tuple[str, int], ...] = ()
        if assignment:
            decoded = ConsumerProtocolMemberAssignment.decode(assignment)
            partitions = tuple(sorted((tp.topic, tp.partition) for tp in decoded.partitions()))
        out.append(groups.Member(client_id or member_id, host or "", None, partitions, 0))
    return str(state), out


def with_owners(rows: list[PartitionLag], members: list[groups.Member]) -> list[PartitionLag]:
    owner = groups.owners(members)
    out = []
    for r in rows:
        m = owner.get((r.topic, r.partition))
        out.append(
            PartitionLag(
                r.topic,
                r.partition,
                r.end_offset,
                r.committed,
                m.member if m else None,
                m.host if m else None,
            )
        )
    return out


async def group_lag(settings: Settings, group_id: str, topic: str) -> list[PartitionLag]:
    """Committed offsets of ``group_id`` on ``topic`` against the partitions' end offsets."""
    return (await describe_lag(settings, group_id, topic, owners=False)).rows


async def describe_lag(
    settings: Settings, group_id: str, topic: str, *, owners: bool = True
) -> GroupLag:
    """Lag per partition of ``group_id`` on ``topic``, with the owners and members (broker
    first, then the registry in Redis) when ``owners``."""
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    consumer = kafka.consumer(settings.kafka, enable_auto_commit=False)
    try:
        await admin.start()
        await consumer.start()
    except KafkaConnectionError as exc:
        await consumer.stop()
        await admin.close()
        raise KafkaUnavailable(f"cannot reach Kafka at {settings.kafka.bootstrap}: {exc}") from exc
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        ends = await kafka.end_offsets(consumer, tps)
        # partitions= is required: without it the embedded broker drops the connection
        committed = await admin.list_consumer_group_offsets(group_id, partitions=tps)
        rows = [
            PartitionLag(
                tp.topic,
                tp.partition,
                ends[tp],
                committed[tp].offset if tp in committed and committed[tp].offset >= 0 else None,
            )
            for tp in tps
        ]
        if not owners:
            return GroupLag(group_id, topic, "", rows)
        [response] = await admin.describe_consumer_groups([group_id])
        state, members = broker_members(response.groups[0])
    except KafkaError as exc:
        raise KafkaUnavailable(f"Kafka admin request failed: {exc}") from exc
    finally:
        await consumer.stop()
        await admin.close()
    if any(m.partitions for m in members):
        return GroupLag(group_id, topic, state, with_owners(rows, members), members, "broker")
    registered, note = await _registry(settings, group_id)
    if registered:
        return GroupLag(
            group_id, topic, state, with_owners(rows, registered), registered, "registry"
        )
    if not note:
        note = (
            "the broker does not say which member owns which partition and no worker of this "
            "group is registered in Redis (are the workers running with this Redis?)"
            if members
            else "no member in the group"
        )
    return GroupLag(group_id, topic, state, rows, members, "none", note)


async def _registry(settings: Settings, group_id: str) -> tuple[list[groups.Member], str]:
    client = redis_client(settings.redis)
    try:
        return await groups.members(client, group_id), ""
    except TRANSIENT as exc:
        return [], f"owners unknown: Redis does not answer ({exc})"
    except Exception as exc:  # e.g. RedisUnavailable from redis_call
        return [], f"owners unknown: {exc}"
    finally:
        await client.aclose()
