"""``streamrank worker features``: the Faust worker process."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys

from prometheus_client import CollectorRegistry

from streamrank.errors import one_line
from streamrank.kafka import clients as kafka
from streamrank.runtime import logs
from streamrank.runtime.health import Health
from streamrank.runtime.metrics_http import resolve_port, serve_metrics
from streamrank.settings import Settings
from streams.membership import READY_CHECKS, watch_membership
from streams.metrics import FeatureMetrics
from streams.processor import FeatureProcessor

logger = logging.getLogger(__name__)


def run_features_worker(settings: Settings, *, metrics_port: int | None = None) -> int:
    """Create the topics, serve /metrics, and run the Faust worker until it is stopped."""
    import faust

    from streamrank.kafka.topics import create_topics
    from streams.app import create_app

    async def prepare() -> None:
        # A pod that starts before the broker waits for it instead of crash-looping.
        await kafka.wait_for_broker(settings.kafka, what="features worker")
        await create_topics(settings, topics=(settings.topics.clicks, settings.topics.dead_letters))

    asyncio.run(prepare())
    registry = CollectorRegistry()
    metrics = FeatureMetrics(registry)
    health = Health(READY_CHECKS)
    port = resolve_port(metrics_port, settings.observability.metrics_port, "features")
    serve_metrics(registry, port, health=health)
    processor = FeatureProcessor(settings=settings, metrics=metrics)
    app = create_app(settings, handler=processor.process)
    app.on_lag = metrics.set_lag
    app.on_commit = metrics.committed
    watch_membership(app, settings=settings, metrics=metrics, health_=health)
    logger.info(
        "features worker: group %s, topic %s, path %s, batch %s",
        settings.features.app_id,
        settings.topics.clicks,
        settings.features.path,
        settings.features.batch_size,
    )
    # Each batch allocates ~10 short-lived objects per event: with the default threshold (700)
    # the cyclic GC runs every few dozen events and rescans the long-lived startup heap
    # (Faust, aiokafka, ...). Freeze that heap and collect gen0 less often.
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    # Faust runs the Kafka client in its own thread: every fetch crosses threads twice, and
    # with the default GIL switch interval a fetch reply waits for the main thread's batch work
    # (docs/benchmarks.md has the paired runs).
    sys.setswitchinterval(0.0005)
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
        worker.execute_from_commandline()  # exits the process (SystemExit) when stopped
    except SystemExit:
        crash = worker.crash_reason or app.crash_reason
        if crash is not None:
            # Faust logged the traceback above; the last line says why, for people and probes.
            logger.critical("features worker stopped: %s", one_line(crash))
        raise
    return 0
