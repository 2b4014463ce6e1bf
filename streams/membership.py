"""The features worker in its consumer group, through Faust's public hooks: the
``on_partitions_revoked`` / ``on_partitions_assigned`` signals feed the shared group bookkeeping
(:class:`streamrank.runtime.membership.Membership`: readiness, the group registry, rebalance
metrics), and an app task on the worker's event loop runs its health and registry tasks."""

from __future__ import annotations

from typing import Any

from streamrank.redis.client import redis_client
from streamrank.runtime.health import Health
from streamrank.runtime.membership import Membership
from streamrank.settings import Settings
from streams.metrics import FeatureMetrics

READY_CHECKS = ("group", "redis")  # what /readyz of a features worker waits for


def watch_membership(
    app: Any, *, settings: Settings, metrics: FeatureMetrics, health_: Health
) -> None:
    """Connect the app's rebalance signals and start the registry/health task with the app."""
    membership = Membership(
        kind="features", group=settings.features.app_id, member=app.conf.broker_client_id,
        topics=[settings.topics.clicks], health_=health_, metrics=metrics,
    )  # fmt: skip

    async def revoked(_sender: Any, tps: Any, **_kwargs: Any) -> None:
        membership.revoked()

    async def assigned(_sender: Any, tps: Any, **_kwargs: Any) -> None:
        membership.assigned((tp.topic, tp.partition) for tp in tps)

    app.on_partitions_revoked.connect(revoked)
    app.on_partitions_assigned.connect(assigned)

    async def background() -> None:
        redis = redis_client(settings.redis)
        try:
            await membership.run(redis)
        finally:
            await redis.aclose()

    app.task(background)
