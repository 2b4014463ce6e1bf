"""``streamrank worker outcomes`` and ``streamrank rollout start|drive|status|pause|resume|abort``
(:mod:`scoring.rollout`)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import re
from datetime import UTC, datetime
from typing import Any

from scoring.rollout.join import require_single_redis
from streamrank.errors import ConfigError
from streamrank.redis.client import redis_client
from streamrank.settings import Settings

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """``"10m"`` -> 600.0 seconds (units ms, s, m, h; a bare number is seconds)."""
    match = _DURATION.match(text)
    if match is None:
        raise ConfigError(f"{text!r} is not a duration (e.g. 30s, 10m, 1h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _by() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (containers): say so
        return "a person"


# --- worker outcomes ------------------------------------------------------------------------


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from scoring.rollout.worker import serve

    serve(settings, metrics_port=args.metrics_port)
    return 0


# --- rollout --------------------------------------------------------------------------------


def _print_final(state: Any, as_json: bool) -> int:
    from workbench.cli.common import print_json

    if state is None:
        print("no rollout")
        return 1
    if as_json:
        print_json({**state.fields(), "rev": state.rev})
    else:
        print(f"rollout of {state.new} over {state.old}: {state.status} ({state.reason})")
    return 0 if state.status == "promoted" else 2 if state.status == "rolled_back" else 1


def _start(args: argparse.Namespace, settings: Settings) -> int:
    require_single_redis(settings.redis)
    from scoring.rollout.driver import drive, start_rollout
    from streamrank.runtime.signals import run_until_signalled

    async def go() -> Any:
        redis = redis_client(settings.redis)
        try:
            return await start_rollout(
                redis,
                new=args.version,
                steps=args.steps,
                hold_s=parse_duration(args.hold),
                min_outcomes=args.min_outcomes,
                guard=args.guard,
                by=_by(),
            )
        finally:
            await redis.aclose()

    state = asyncio.run(go())
    print(
        f"rollout of {state.new} over {state.old} started at {state.steps[0]}% "
        f"(split {state.split_text()})",
        flush=True,
    )
    if args.no_drive:
        print("not driving it here: run `streamrank rollout drive` (one driver acts at a time)")
        return 0
    final = run_until_signalled(
        drive(settings, tick_s=parse_duration(args.tick), metrics_port=args.metrics_port)
    )
    if final is None:
        print("driver stopped; the rollout goes on where it is: `streamrank rollout drive`")
        return 130
    return _print_final(final, args.json)


def _drive(args: argparse.Namespace, settings: Settings) -> int:
    require_single_redis(settings.redis)
    from scoring.rollout.driver import drive
    from streamrank.runtime.signals import run_until_signalled

    final = run_until_signalled(
        drive(settings, tick_s=parse_duration(args.tick), metrics_port=args.metrics_port)
    )
    if final is None:
        print("driver stopped")
        return 130
    return _print_final(final, args.json)


def _control(args: argparse.Namespace, settings: Settings) -> int:
    require_single_redis(settings.redis)
    from scoring.rollout.driver import control

    async def go() -> Any:
        redis = redis_client(settings.redis)
        try:
            return await control(redis, args.rollout_action, by=_by())
        finally:
            await redis.aclose()

    state = asyncio.run(go())
    print(f"rollout of {state.new}: {state.status} ({state.reason})")
    return 0


def _interval(entry: dict[str, Any], fmt: str, scale: float = 1.0) -> str:
    value, lo, hi = entry.get("value"), entry.get("lo"), entry.get("hi")
    if value is None:
        return "-"
    text = format(value * scale, fmt)
    if lo is None or hi is None:
        return f"{text} [?]"
    return f"{text} [{format(lo * scale, fmt)}, {format(hi * scale, fmt)}]"


def render_status(report: dict[str, Any]) -> str:
    """The status report as a table and a few lines (what `rollout status` prints)."""
    lines = [f"window: {report['window']['name']}; baseline {report['baseline'] or '-'}"]
    header = (
        f"{'version':<24} {'role':<11} {'share':>6} {'requests':>8}  {'CTR@5':<24} "
        f"{'AUC':<24} {'GAUC':<24} {'p99 ms':<20} {'degraded %':<22} verdict (AUC)"
    )
    lines.append(header)
    for row in report["versions"]:
        verdict = row.get("vs_baseline", {}).get("auc", {}).get("verdict", "")
        lines.append(
            f"{row['version']:<24} {row['role']:<11} {row['share']:>6.0%} {row['requests']:>8}  "
            f"{_interval(row['ctr5'], '.3f'):<24} {_interval(row['auc'], '.4f'):<24} "
            f"{_interval(row['gauc'], '.4f'):<24} {_interval(row['p99_ms'], '.1f'):<20} "
            f"{_interval(row['degraded'], '.2f', 100):<22} {verdict}"
        )
    lines += _retrain_lines(report.get("retrain") or [])
    rollout = report["rollout"]
    if rollout is None:
        lines.append("no rollout")
        return "\n".join(lines)
    lines.append(
        f"rollout: {rollout['new']} over {rollout['old']}: {rollout['status']} at "
        f"{rollout['steps'][rollout['step']]}% of {rollout['steps']} (held {rollout['held_s']}s "
        f"of {rollout['hold_s']}s, {rollout['min_outcomes']} outcomes per step); "
        f"driver {rollout['driver']['owner'] or 'none'}"
    )
    lines.append(f"  {rollout['reason']}")
    for check in rollout["checks"]:
        lines.append(f"  guard {check['check']}: {check['status']} ({check['detail']})")
    for entry in rollout["history"][-5:]:
        lines.append(
            f"  history: {entry['action']} at {entry['share']:.0%} by {entry['by']}: "
            f"{entry['reason']}"
        )
    return "\n".join(lines)


def _retrain_lines(cycles: list[dict[str, Any]]) -> list[str]:
    """The retrain loop's latest cycles, newest first (none: the loop never ran)."""
    lines = []
    for c in cycles[:3]:
        when = datetime.fromtimestamp(c["finished_ms"] / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")
        lines.append(
            f"retrain {when}: {c['outcome']} {c.get('candidate') or '-'} "
            f"(active {c.get('active') or '-'}): {c['reason']}"
        )
    return lines


def _status(args: argparse.Namespace, settings: Settings) -> int:
    require_single_redis(settings.redis)
    from scoring.rollout.status import rollout_status
    from streamrank import clock
    from workbench.cli.common import print_json

    async def go() -> dict[str, Any]:
        redis = redis_client(settings.redis)
        try:
            return await rollout_status(
                redis,
                bucket_s=settings.outcomes.bucket_s,
                window_s=int(parse_duration(args.window)) if args.window else None,
                now_ms=clock.now_ms(),
            )
        finally:
            await redis.aclose()

    report = asyncio.run(go())
    if args.json:
        print_json(report)
    else:
        print(render_status(report))
    return 0


def register(sub: Any) -> None:
    from scoring.rollout.guard import DEFAULT_GUARD
    from workbench.cli.common import worker_kinds

    outcomes = worker_kinds(sub).add_parser(
        "outcomes", help="join served results with later clicks: online metrics per version"
    )
    outcomes.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="/metrics port (default: STREAMRANK_METRICS_PORT or 9466; 0 disables)",
    )
    outcomes.set_defaults(func=_worker)

    rollout = sub.add_parser(
        "rollout", help="staged rollout of a model version, guarded by its online metrics"
    )
    actions = rollout.add_subparsers(dest="rollout_action", metavar="ACTION")
    actions.required = True

    def driver_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--tick", default="5s", help="how often the guard looks (default 5s)")
        p.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="/metrics port of the driver (default: STREAMRANK_METRICS_PORT or 9467; 0 "
            "disables)",
        )
        p.add_argument("--json", action="store_true", help="print the final state as JSON")

    start = actions.add_parser(
        "start",
        help="roll VERSION out over the active one step by step, rolling back when the guard "
        "fails; drives it until it ends (Ctrl-C leaves it where it is)",
    )
    start.add_argument("version", help="a published version")
    start.add_argument("--steps", default="5,20,50,100", help="percent of users per step")
    start.add_argument("--hold", default="10m", help="least time per step (e.g. 10m, 30s)")
    start.add_argument("--min-outcomes", type=int, default=1000,
                       help="requests each version needs in a step's window before the guard "
                       "decides (default 1000)")  # fmt: skip
    start.add_argument("--guard", default=DEFAULT_GUARD,
                       help=f"checks, comma-separated (default {DEFAULT_GUARD.replace('%', '%%')}): auc, gauc, "
                       "ctr1, ctr5, ctr10, mrr:MARGIN (new not worse than old by more than "
                       "MARGIN at 95%% confidence); p99:MS and degraded:SHARE for the new "
                       "version alone; slower:MS (new p99 over old p99 by more than MS, "
                       "same window)")  # fmt: skip
    start.add_argument("--no-drive", action="store_true",
                       help="only start it; `streamrank rollout drive` drives it")  # fmt: skip
    driver_options(start)
    start.set_defaults(func=_start)

    drive_cmd = actions.add_parser(
        "drive", help="drive the current rollout until it ends (after a restart, or elsewhere)"
    )
    driver_options(drive_cmd)
    drive_cmd.set_defaults(func=_drive)

    status = actions.add_parser(
        "status", help="versions serving now: online metrics with intervals, verdicts, rollout"
    )
    status.add_argument("--window", default=None,
                        help="trailing window (e.g. 10m, 1h); default: the current rollout "
                        "step's, else 10m")  # fmt: skip
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    status.set_defaults(func=_status)

    for name, text in (
        ("pause", "stop advancing (the guard still rolls back a failing version)"),
        ("resume", "advance again (restores the step's split)"),
        ("abort", "end the rollout now: the old version serves everyone"),
    ):
        actions.add_parser(name, help=text).set_defaults(func=_control)
