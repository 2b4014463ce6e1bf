"""``streamrank worker features``: the Faust worker process.

Faust owns the event loop, the consumer group and the signals here; the shared runtime gives
the rest: waiting for the broker, the ``/metrics`` + ``/healthz`` + ``/readyz`` server, the
consumer-group metrics and the group bookkeeping (:mod:`streams.membership`)."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from typing import Any

from prometheus_client import CollectorRegistry

from streamrank.errors import one_line
from streamrank.kafka import clients as kafka
from streamrank.runtime import logs
from streamrank.runtime.health import Health
from streamrank.runtime.loop_health import GcPauses, freeze_start_up_objects, watch_loop_lag
from streamrank.runtime.metrics_http import metrics_server, resolve_port
from streamrank.settings import Settings
from streams.membership import READY_CHECKS, watch_membership
from streams.metrics import FeatureMetrics
from streams.processor import FeatureProcessor

logger = logging.getLogger(__name__)


def serve(settings: Settings, *, metrics_port: int | None = None) -> int:
    """Create the topics, serve /metrics, and run the Faust worker until it is stopped."""
    from streams.app import create_app

    asyncio.run(_prepare(settings))
    registry = CollectorRegistry()
    metrics = FeatureMetrics(registry)
    health = Health(READY_CHECKS)
    processor = FeatureProcessor(settings=settings, metrics=metrics)
    app = create_app(settings, handler=processor.process)
    app.on_lag = metrics.set_lag
    app.on_commit = metrics.committed
    app.on_fetch_wait = lambda ms: metrics.fetch_wait.set(ms / 1000)
    watch_membership(app, settings=settings, metrics=metrics, health_=health)

    async def loop_lag() -> None:
        await watch_loop_lag(metrics.loop_lag.observe)

    app.task(loop_lag)
    GcPauses(metrics.gc_paused).install()
    logger.info(
        "features worker: group %s, topics %s and %s, path %s, batch %s",
        settings.features.app_id,
        settings.topics.clicks,
        settings.topics.items,
        settings.features.path,
        settings.features.batch_size,
    )
    port = resolve_port(metrics_port, settings.observability.metrics_port, "features")
    with metrics_server(registry, port, health=health):
        _tune_interpreter()
        _run_faust(app, settings)
    return 0


async def _prepare(settings: Settings) -> None:
    from streamrank.kafka.topics import create_topics

    # A pod that starts before the broker waits for it instead of crash-looping.
    await kafka.wait_for_broker(settings.kafka, what="features worker")
    topics = (settings.topics.clicks, settings.topics.items, settings.topics.dead_letters)
    await create_topics(settings, topics=topics)


def _tune_interpreter() -> None:
    # Each batch allocates ~10 short-lived objects per event: with the default threshold (700)
    # the cyclic GC runs every few dozen events and rescans the long-lived startup heap
    # (Faust, aiokafka, ...). Freeze that heap and collect gen0 less often.
    freeze_start_up_objects()
    gc.set_threshold(100_000, 50, 100)
    # Faust runs the Kafka client in its own thread: every fetch crosses threads twice, and
    # with the default GIL switch interval a fetch reply waits for the main thread's batch work
    # (docs/benchmarks.md has the paired runs).
    sys.setswitchinterval(0.0005)


def _run_faust(app: Any, settings: Settings) -> None:
    """Faust's worker: it handles SIGTERM/SIGINT (leaves the group, commits) and exits the
    process (SystemExit) when stopped."""
    import faust

    worker = faust.Worker(
        app,
        loglevel=settings.observability.log_level.lower(),
        quiet=True,
        redirect_stdouts=False,
        # JSON lines replace Faust's coloured text handler (text keeps Faust's own).
        logging_config=logs.dict_config(settings.observability.log_level, "json")
        if settings.observability.log_format == "json"
        else None,
    )
    try:
        worker.execute_from_commandline()
    except SystemExit:
        crash = worker.crash_reason or app.crash_reason
        if crash is not None:
            # Faust logged the traceback above; the last line says why, for people and probes.
            logger.critical("features worker stopped: %s", one_line(crash))
        raise
