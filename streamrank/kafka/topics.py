"""Create the engine's topics (idempotent)."""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError

from streamrank.errors import KafkaUnavailable, StreamrankError
from streamrank.settings import KafkaSettings, Settings

logger = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = TopicAlreadyExistsError.errno


async def create_topics(
    settings: Settings, *, partitions: int | None = None, topics: tuple[str, ...] | None = None
) -> dict[str, str]:
    """Create each topic that does not exist yet; return ``{topic: "created" | "exists"}``.

    An existing topic keeps its partition count (a warning says so when it differs from the
    requested one: partitions can only grow, and growing them re-maps keys).
    """
    partitions = partitions or settings.topics.partitions
    names = topics or settings.topics.names()
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs(), request_timeout_ms=10_000)
    try:
        await admin.start()
    except KafkaConnectionError as exc:
        raise KafkaUnavailable(
            f"cannot reach Kafka at {settings.kafka.bootstrap}: {exc}; is the stack up "
            "(`streamrank stack up`) or STREAMRANK_KAFKA_BOOTSTRAP right?"
        ) from exc
    try:
        existing = set(await admin.list_topics())
        wanted = [
            NewTopic(name, partitions, settings.topics.replication)
            for name in names
            if name not in existing
        ]
        result = {name: "exists" for name in names if name in existing}
        if wanted:
            response = await admin.create_topics(wanted)
            for topic, code, message in response.topic_errors:
                if code == 0:
                    result[topic] = "created"
                elif code == _TOPIC_ALREADY_EXISTS:
                    result[topic] = "exists"
                else:
                    raise StreamrankError(
                        f"could not create topic {topic!r}: error {code}: {message}"
                    )
        for description in await admin.describe_topics(
            [n for n, s in result.items() if s == "exists"]
        ):
            count = len(description.get("partitions", []))
            if count and count != partitions:
                logger.warning(
                    "topic %s exists with %s partitions (asked for %s); left as it is",
                    description["topic"],
                    count,
                    partitions,
                )
        return result
    except KafkaError as exc:
        raise KafkaUnavailable(f"Kafka admin request failed: {exc}") from exc
    finally:
        await admin.close()


async def partition_count(kafka: KafkaSettings, topic: str) -> int:
    """Number of partitions of one topic (0 when it does not exist)."""
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
        return len(described[0].get("partitions", [])) if described else 0
    finally:
        await admin.close()
