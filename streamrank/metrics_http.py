"""Serving a Prometheus registry at ``/metrics``; each worker kind builds its own metrics object
(``streams.metrics``, ``scoring.training.evaluation``) from an injected registry and hands it here."""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

logger = logging.getLogger(__name__)

DEFAULT_PORTS = {"features": 9464, "scoring": 9465, "outcomes": 9466, "rollout": 9467}


def resolve_port(cli_port: int | None, settings_port: int | None, worker_kind: str) -> int:
    """``--metrics-port`` wins, then ``STREAMRANK_METRICS_PORT``, then the worker kind's default."""
    if cli_port is not None:
        return cli_port
    if settings_port is not None:
        return settings_port
    return DEFAULT_PORTS[worker_kind]


def serve_metrics(registry: CollectorRegistry, port: int, *, host: str = "0.0.0.0") -> Any | None:
    """Start the ``/metrics`` HTTP server in a daemon thread; port 0 disables it (returns None)."""
    if port == 0:
        logger.info("metrics endpoint disabled (port 0)")
        return None
    server, _thread = start_http_server(port, addr=host, registry=registry)
    logger.info("serving metrics at http://%s:%s/metrics", host, port)
    return server
