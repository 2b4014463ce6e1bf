"""``streamrank lag``: how far each consumer group is behind, per partition.

Lag = the partition's end offset (high watermark) minus the group's committed offset: the
number of records the group has not yet committed. It is what ops watch when deciding to add
workers (up to the topic's partition count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError

from streamrank.errors import KafkaUnavailable
from streamrank.settings import Settings


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    end_offset: int
    committed: int | None  # None: the group has committed nothing on this partition yet

    @property
    def lag(self) -> int:
        return self.end_offset - (self.committed or 0)


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
            }
            for r in sorted(rows, key=lambda r: (r.topic, r.partition))
        ],
    }


async def group_lag(settings: Settings, group_id: str, topic: str) -> list[PartitionLag]:
    """Committed offsets of ``group_id`` on ``topic`` against the partitions' end offsets."""
    admin = AIOKafkaAdminClient(**settings.kafka_client_kwargs())
    consumer = AIOKafkaConsumer(**settings.kafka_client_kwargs(), enable_auto_commit=False)
    try:
        await admin.start()
        await consumer.start()
    except KafkaConnectionError as exc:
        raise KafkaUnavailable(f"cannot reach Kafka at {settings.kafka_bootstrap}: {exc}") from exc
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        ends = await consumer.end_offsets(tps) if tps else {}
        committed = await admin.list_consumer_group_offsets(group_id, partitions=tps)
        return [
            PartitionLag(
                tp.topic,
                tp.partition,
                ends[tp],
                committed[tp].offset if tp in committed and committed[tp].offset >= 0 else None,
            )
            for tp in tps
        ]
    finally:
        await consumer.stop()
        await admin.close()
