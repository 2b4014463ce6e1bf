"""``streamrank worker scoring`` and ``streamrank rank``."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from streamrank.redis.client import redis_client
from streamrank.settings import Settings


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from scoring.serving.worker import serve

    serve(settings, metrics_port=args.metrics_port)
    return 0


async def rank_once(
    settings: Settings,
    user: str,
    items: list[str] | None,
    timeout_s: float,
    ts: int | None = None,
    **options: Any,
) -> Any:
    """One request through a :class:`RankClient`; ``items`` None retrieves; ``options``:
    ``top_k``, ``scene``, ``exclude``."""
    from scoring.client import RankClient

    async with RankClient(settings=settings) as client:
        return await client.rank(user, items, timeout=timeout_s, ts=ts, **options)


def _epoch_ms(text: str) -> int:
    """An epoch-ms flag value, checked as the request contract checks ``ts``."""
    from schemas import MAX_TS_MS

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer (epoch ms): {text!r}") from None
    if not 0 <= value <= MAX_TS_MS:
        raise argparse.ArgumentTypeError(f"epoch ms must be in 0..{MAX_TS_MS}, got {value}")
    return value


def id_list(text: str) -> list[str]:
    """A comma-separated list of ids (blanks dropped); at least one."""
    ids = [i.strip() for i in text.split(",") if i.strip()]
    if not ids:
        raise argparse.ArgumentTypeError(f"no ids in {text!r}: give them comma-separated, a,b,c")
    return ids


def _top_k(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--top-k must be at least 1, got {value}")
    return value


def result_lines(result: Any) -> list[str]:
    """``streamrank rank``'s human output: the model and flags, the items best first with their
    scores (equal scores in reply order), the stage timings."""
    flags = []
    if result.cached:
        flags.append("cached")
    if result.degraded:
        flags.append(f"DEGRADED ({result.reason})")
    head = f"user {result.user_id}, model {result.model_version or '-'}"
    lines = [head + (f", {', '.join(flags)}" if flags else "")]
    ranked = sorted(zip(result.items, result.scores, strict=True), key=lambda p: -p[1])
    width = len(str(len(ranked)))
    lines += [f"  {n:>{width}}. {score:.4f}  {item}" for n, (item, score) in enumerate(ranked, 1)]
    if not ranked:
        lines.append("  (no items)")
    timings = ", ".join(f"{k} {v:.1f}" for k, v in result.timings_ms.items())
    lines.append(f"timings (ms): {timings or '-'}")
    return lines


def _rank(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.cli.common import print_json

    result = asyncio.run(
        rank_once(
            settings,
            args.user,
            args.items,
            args.timeout,
            args.ts,
            top_k=args.top_k,
            scene=args.scene,
            exclude=args.exclude,
        )
    )
    if args.json:
        print_json(result)
        return 0
    print("\n".join(result_lines(result)))
    return 0


async def canary(settings: Settings, split: str | None) -> dict[str, Any]:

    from scoring.model.versions import set_split
    from streamrank import keys

    client = redis_client(settings.redis)
    try:
        parsed = await set_split(client, split)
        active = await client.get(keys.active_model())
    finally:
        await client.aclose()
    return {
        "split": None if parsed is None else {v: w for v, w in parsed},
        "active": active.decode() if isinstance(active, bytes) else active,
    }


def _canary(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.cli.common import print_json

    split = None if args.action == "clear" else args.split
    if args.action == "set" and not split:
        raise SystemExit("streamrank canary set: give the split, e.g. din-a:0.9,din-b:0.1")
    print_json(asyncio.run(canary(settings, split)))
    return 0


def register(sub: Any) -> None:
    from workbench.cli.common import worker_kinds

    scoring = worker_kinds(sub).add_parser("scoring", help="rank requests from Kafka with DIN")
    scoring.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="/metrics port (default: STREAMRANK_METRICS_PORT or 9465; 0 disables)",
    )
    scoring.set_defaults(func=_worker)

    rank = sub.add_parser(
        "rank",
        help="rank items for a user through the scoring worker, or (without --items) have it "
        "retrieve them",
    )
    rank.add_argument("--user", required=True, help="user id")
    rank.add_argument(
        "--items",
        type=id_list,
        default=None,
        help="comma-separated candidate ids (default: none, the engine retrieves candidates)",
    )
    rank.add_argument(
        "--top-k",
        type=_top_k,
        default=None,
        metavar="K",
        help="only the best K, sorted best first (default: every candidate given, or the "
        "scene's reply length for a retrieval request)",
    )
    rank.add_argument(
        "--scene", default=None, help="the scene whose rules apply (default: default)"
    )
    rank.add_argument(
        "--exclude",
        type=id_list,
        default=None,
        metavar="IDS",
        help="comma-separated item ids never to return",
    )
    rank.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the reply")
    rank.add_argument(
        "--ts",
        type=_epoch_ms,
        default=None,
        metavar="MS",
        help="the request's time (epoch ms): features as of then (default: the Kafka timestamp)",
    )
    rank.add_argument("--json", action="store_true", help="print the RankResult as JSON")
    rank.set_defaults(func=_rank)

    canary_cmd = sub.add_parser(
        "canary",
        help="split traffic between published versions by user (sr:model:split); "
        "'clear' returns to the active pointer",
    )
    canary_cmd.add_argument("action", choices=("set", "clear"))
    canary_cmd.add_argument("split", nargs="?", help="e.g. din-a:0.9,din-b:0.1")
    canary_cmd.set_defaults(func=_canary)
