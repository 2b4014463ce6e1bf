"""The ``streamrank`` command line.

Each command lives beside the code it drives and registers itself here through a
``register(subparsers)`` function; handlers take ``(args, settings)`` and return an exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import aiokafka.errors
import orjson
import redis.exceptions

from streamrank import __version__
from streamrank.errors import StreamrankError, one_line
from streamrank.settings import Settings

logger = logging.getLogger("streamrank")

Handler = Callable[[argparse.Namespace, Settings], int]

# Modules that add subcommands: each defines register(subparsers).
COMMAND_MODULES: tuple[str, ...] = (
    "streamrank.cli_stack",
    "streamrank.demo",
    "streamrank.bench",
    "streamrank.cli_settings",
    "streamrank.lag",
    "scoring.cli_embeddings",
    "streams.cli",
    "scoring.cli_model",
    "scoring.cli",
    "streamrank.replay",
)


def print_json(value: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(
        orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
    )
    sys.stdout.write("\n")
    sys.stdout.flush()


def worker_kinds(sub: Any) -> Any:
    """The subparsers of ``streamrank worker KIND``, shared by the areas that add a worker kind."""
    worker = sub.choices.get("worker")
    if worker is None:
        worker = sub.add_parser("worker", help="run a worker process (features, scoring)")
        kinds = worker.add_subparsers(dest="worker_kind", metavar="KIND")
        kinds.required = True
        worker.kinds = kinds
    return worker.kinds


def run_async(coro: Any) -> Any:
    """Run a coroutine to completion; Ctrl-C cancels it cleanly."""
    return asyncio.run(coro)


def run_until_signalled(coro: Any) -> Any:
    """Run a long-lived coroutine; SIGINT (Ctrl-C) or SIGTERM cancel it, so its ``finally``
    blocks stop what it started. Explicit handlers, because a process started in the background
    inherits an ignored SIGINT and would never see Ctrl-C as KeyboardInterrupt."""

    async def main() -> Any:
        task = asyncio.ensure_future(coro)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            logger.info("stopped by signal")
            return None
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from the environment, overridden by the flags that map onto settings."""
    overrides = {k: v for k, v in getattr(args, "settings_overrides", {}).items() if v is not None}
    for flag, field in getattr(args, "setting_flags", {}).items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides[field] = value
    return Settings(**overrides)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrank",
        description="Real-time feature and scoring engine for recommendation ranking.",
    )
    parser.add_argument("--version", action="version", version=f"streamrank {__version__}")
    parser.add_argument(
        "--log-level", default=None, help="DEBUG, INFO, WARNING (default: settings)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"streamrank: invalid settings: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=(args.log_level or settings.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    handler: Handler = args.func
    try:
        return handler(args, settings)
    except StreamrankError as exc:
        print(f"streamrank: {exc}", file=sys.stderr)
        return 1
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        print(
            f"streamrank: cannot reach Redis ({exc}); is the stack up (`streamrank stack up`) "
            "or STREAMRANK_REDIS_URL right?",
            file=sys.stderr,
        )
        return 1
    except aiokafka.errors.KafkaConnectionError as exc:
        print(
            f"streamrank: cannot reach Kafka at {settings.kafka_bootstrap} ({exc}); is the stack "
            "up (`streamrank stack up`) or STREAMRANK_KAFKA_BOOTSTRAP right?",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print("streamrank: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # A bug of ours: the traceback for whoever fixes it, then one line saying why.
        logger.error("%s failed", args.command, exc_info=True)
        print(f"streamrank: {args.command} stopped: {one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
