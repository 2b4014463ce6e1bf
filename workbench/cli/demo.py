"""``streamrank demo``: the whole pipeline on the embedded stack (:mod:`workbench.demo`)."""

from __future__ import annotations

import argparse
import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from streamrank.runtime.signals import run_until_signalled
from streamrank.settings import Settings


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt while the (synchronous) training runs, so the
    stack is still stopped: a background process inherits an ignored SIGINT, and SIGTERM would
    end the process without running any ``finally``."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.demo import prepare_model, run_demo, say
    from workbench.devstack.stack import stack_from

    # Settings that name a cluster get the embedded stack with a local cluster.
    stack = stack_from(settings, redis_cluster=True if settings.redis.is_cluster else None)
    status = stack.status()
    we_started = not (status["kafka"]["up"] and status["redis"]["up"])
    if we_started:
        say("starting the embedded stack ...")
        stack.up(timeout_s=120)
    else:
        say("using the stack that is already up")
    status = stack.status()
    say(
        f"kafka {status['kafka']['bootstrap']} up={status['kafka']['up']}; "
        f"redis {status['redis']['url']} up={status['redis']['up']}"
    )
    try:
        with _interruptible():
            model = prepare_model(settings, synthetic=args.synthetic, progress=not args.no_progress)
        run_until_signalled(
            run_demo(
                settings,
                model,
                duration_s=args.duration,
                rate=args.rate,
                every_s=args.every,
                request_rate=args.requests,
                view=args.view,
                logs=Path(settings.tools.run_dir).resolve() / "demo",
            )
        )
        say("shutting down")
    finally:
        if we_started:
            with contextlib.suppress(KeyboardInterrupt):
                stopped = stack.down()
                say("stopped " + ", ".join(stopped))
    return 0


def register(sub: Any) -> None:
    demo = sub.add_parser("demo", help="run the whole pipeline on the embedded stack")
    demo.add_argument(
        "--duration", type=float, default=None, help="seconds to run (default: until Ctrl-C)"
    )
    demo.add_argument("--rate", type=float, default=200.0, help="clicks produced per second")
    demo.add_argument(
        "--requests", type=float, default=20.0, help="rank requests produced per second"
    )
    demo.add_argument(
        "--view",
        choices=("top", "user"),
        default="top",
        help="top: the live dashboard of `streamrank top` (default); user: one user's sequence "
        "and ranked candidates every --every seconds",
    )
    demo.add_argument("--every", type=float, default=3.0, help="seconds between printouts")
    demo.add_argument(
        "--synthetic", action="store_true", help="synthetic clicks even when MovieLens is there"
    )
    demo.add_argument("--no-progress", action="store_true", help="no training progress bar")
    demo.set_defaults(func=_demo)
