"""The workers' HTTP endpoint: ``/metrics`` (a Prometheus registry; each worker kind builds its
own metrics object from an injected registry), ``/healthz`` and ``/readyz``
(:mod:`streamrank.runtime.health`), in one daemon thread on one port."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from streamrank.runtime.health import Health

logger = logging.getLogger(__name__)

DEFAULT_PORTS = {
    "features": 9464,
    "scoring": 9465,
    "outcomes": 9466,
    "rollout": 9467,
    "overlay": 9468,
}


def resolve_port(cli_port: int | None, settings_port: int | None, worker_kind: str) -> int:
    """``--metrics-port`` wins, then ``STREAMRANK_METRICS_PORT``, then the worker kind's default."""
    if cli_port is not None:
        return cli_port
    if settings_port is not None:
        return settings_port
    return DEFAULT_PORTS[worker_kind]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds
        pass


def wsgi_app(registry: CollectorRegistry, health: Health | None) -> Callable[..., Iterable[bytes]]:
    """``/healthz`` and ``/readyz`` from ``health`` (200 or 503, a JSON body saying why);
    everything else is the registry's metrics."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            if health is None:
                ok, body = True, {"status": "ok", "detail": "no health checks in this process"}
            else:
                ok, body = health.liveness() if path == "/healthz" else health.readiness()
            payload = json.dumps(body).encode()
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))],
            )
            return [payload]
        return metrics(environ, start_response)

    return app


def serve_metrics(
    registry: CollectorRegistry, port: int, *, health: Health | None = None, host: str = "0.0.0.0"
) -> Any | None:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` in a daemon thread; port 0 disables it
    (returns None). Returns the server (``shutdown()`` stops it)."""
    if port == 0:
        logger.info("metrics and health endpoints disabled (port 0)")
        return None
    server = make_server(
        host, port, wsgi_app(registry, health), ThreadingWSGIServer, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    logger.info("serving metrics at http://%s:%s/metrics (health: /healthz, /readyz)", host, port)
    return server


@contextlib.contextmanager
def metrics_server(
    registry: CollectorRegistry, port: int, *, health: Health | None = None
) -> Iterator[None]:
    """:func:`serve_metrics` for the duration of a ``with`` block."""
    server = serve_metrics(registry, port, health=health)
    try:
        yield
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
