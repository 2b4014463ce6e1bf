"""``streamrank worker scoring`` and ``streamrank rank``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Any

from streamrank.settings import Settings


def worker_subparsers(sub: Any) -> Any:
    """The ``worker KIND`` sub-command group, shared with the other worker kinds (get or create)."""
    worker = sub.choices.get("worker")
    if worker is None:
        worker = sub.add_parser("worker", help="run a worker (features, scoring)")
        kinds = worker.add_subparsers(dest="worker_kind", metavar="KIND")
        kinds.required = True
        return kinds
    return worker._subparsers._group_actions[0]


async def serve(settings: Settings, metrics_port: int | None) -> None:
    """Run one scoring worker until SIGINT/SIGTERM."""
    from prometheus_client import CollectorRegistry

    from scoring.worker import ScoringWorker
    from streamrank.metrics_http import resolve_port, serve_metrics

    registry = CollectorRegistry()
    port = resolve_port(metrics_port, settings.metrics_port, "scoring")
    server = serve_metrics(registry, port)
    worker = ScoringWorker(settings=settings, registry=registry)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, worker.request_stop)
    try:
        async with worker:
            await worker.run()
    finally:
        if server is not None:
            server.shutdown()


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    asyncio.run(serve(settings, args.metrics_port))
    return 0


async def rank_once(settings: Settings, user: str, items: list[str], timeout_s: float) -> Any:
    from scoring.client import RankClient

    async with RankClient(settings=settings) as client:
        return await client.rank(user, items, timeout=timeout_s)


def _rank(args: argparse.Namespace, settings: Settings) -> int:
    from streamrank.cli import print_json

    items = [i.strip() for i in args.items.split(",") if i.strip()]
    result = asyncio.run(rank_once(settings, args.user, items, args.timeout))
    if args.json:
        print_json(result)
        return 0
    flag = f" DEGRADED ({result.reason})" if result.degraded else ""
    print(f"user {result.user_id}, model {result.model_version or '-'}{flag}")
    for item, score in sorted(zip(result.items, result.scores, strict=True), key=lambda p: -p[1]):
        print(f"  {score:.4f}  {item}")
    timings = ", ".join(f"{k} {v:.1f}" for k, v in result.timings_ms.items())
    print(f"timings (ms): {timings}")
    return 0


def register(sub: Any) -> None:
    kinds = worker_subparsers(sub)
    scoring = kinds.add_parser("scoring", help="rank requests from Kafka with DIN")
    scoring.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="/metrics port (default: STREAMRANK_METRICS_PORT or 9465; 0 disables)",
    )
    scoring.set_defaults(func=_worker)

    rank = sub.add_parser("rank", help="score items for a user through the scoring worker")
    rank.add_argument("--user", required=True, help="user id")
    rank.add_argument("--items", required=True, help="comma-separated item ids")
    rank.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the reply")
    rank.add_argument("--json", action="store_true", help="print the RankResult as JSON")
    rank.set_defaults(func=_rank)
