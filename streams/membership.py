"""The features worker in its consumer group: its assignment in the group registry
(:mod:`streamrank.runtime.groups`), readiness (:mod:`streamrank.runtime.health`) and rebalance metrics, all
through Faust's public hooks: the ``on_partitions_revoked`` / ``on_partitions_assigned``
signals and an app task on the worker's event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from streamrank.redis.client import redis_client
from streamrank.runtime import groups, health
from streamrank.runtime.health import Health
from streamrank.runtime.tasks import cancel_and_wait
from streamrank.settings import Settings
from streams.metrics import FeatureMetrics

logger = logging.getLogger(__name__)

READY_CHECKS = ("group", "redis")  # what /readyz of a features worker waits for


def watch_membership(
    app: Any, *, settings: Settings, metrics: FeatureMetrics, health_: Health
) -> None:
    """Connect the app's rebalance signals and start the registry/health task with the app."""
    registration = groups.Registration(
        redis=None, group=settings.features.app_id, member=app.conf.broker_client_id,
        kind="features",
    )  # fmt: skip
    state: dict[str, float | None] = {"revoked_at": time.monotonic()}  # the first join counts

    async def revoked(_sender: Any, tps: Any, **_kwargs: Any) -> None:
        state["revoked_at"] = time.monotonic()
        health_.set("group", False, "rebalancing")

    async def assigned(_sender: Any, tps: Any, **_kwargs: Any) -> None:
        started = state["revoked_at"]
        took = time.monotonic() - started if started is not None else 0.0
        state["revoked_at"] = None
        partitions = {(tp.topic, tp.partition) for tp in tps}
        metrics.assigned(partitions, rebalance_s=took)
        registration.assigned(partitions)
        health_.set("group", True, f"{len(partitions)} partitions of {settings.topics.clicks}")
        logger.info(
            "partitions assigned after %.1fs: %s",
            took,
            ",".join(f"{t}[{p}]" for t, p in sorted(partitions)) or "none",
        )

    app.on_partitions_revoked.connect(revoked)
    app.on_partitions_assigned.connect(assigned)

    async def background() -> None:
        redis = redis_client(settings.redis)
        registration.redis = redis
        tasks = [
            asyncio.create_task(health.watch(health_, redis=redis), name="health"),
            asyncio.create_task(registration.run(), name="group-registry"),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            await cancel_and_wait(tasks, what="features worker")
            await registration.withdraw()
            await redis.aclose()

    app.task(background)
