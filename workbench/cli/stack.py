"""``streamrank stack up|down|status`` and ``streamrank topics create``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from streamrank.settings import Settings


def _stack(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.cli.common import print_json
    from workbench.devstack.stack import stack_from

    # `up` starts what is asked for; `down` and `status` act on what this run dir runs.
    stack = stack_from(settings, redis_cluster=args.redis_cluster if args.action == "up" else None)
    if args.action == "up":
        status = stack.up(timeout_s=args.timeout)
        _report(status, args.json)
        if not args.json:
            print("export " + " ".join(f"{k}={v}" for k, v in stack.client_env().items()))
        return 0
    if args.action == "down":
        stopped = stack.down()
        if args.json:
            print_json({"stopped": stopped})
        else:
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        return 0
    status = stack.status()
    _report(status, args.json)
    return 0 if status["kafka"]["up"] and status["redis"]["up"] else 3


def _report(status: dict[str, Any], as_json: bool) -> None:
    from workbench.cli.common import print_json

    if as_json:
        print_json({k: status[k] for k in ("kafka", "redis")})
        return
    kafka, redis = status["kafka"], status["redis"]
    print(f"kafka  {kafka['bootstrap']:<36} {'up' if kafka['up'] else 'down'}")
    state = f" (cluster_state {redis['state']})" if redis["mode"] == "cluster" else ""
    print(f"redis  {redis['url']:<36} {'up' if redis['up'] else 'down'}{state}")
    for node in redis.get("nodes", ()):
        serves = f"{node['slots']} slots" if node["role"] == "master" else "replica"
        print(
            f"  node {node['address']:<21} {node['role']:<8} {serves:<12} {'up' if node['up'] else 'down'}"
        )


def _topics(args: argparse.Namespace, settings: Settings) -> int:
    from streamrank.kafka.topics import create_topics
    from workbench.cli.common import print_json, run_async

    result = run_async(create_topics(settings, partitions=args.partitions))
    if args.json:
        print_json(result)
    else:
        for topic, state in result.items():
            print(f"{topic:<20} {state}", file=sys.stdout)
    return 0


def register(sub: Any) -> None:
    stack = sub.add_parser("stack", help="start, stop or inspect the embedded Kafka + Redis stack")
    stack.add_argument("action", choices=("up", "down", "status"))
    stack.add_argument("--json", action="store_true", help="print JSON")
    stack.add_argument("--kafka-port", type=int, help="broker port (STREAMRANK_STACK_KAFKA_PORT)")
    stack.add_argument("--redis-port", type=int, help="Redis port (STREAMRANK_STACK_REDIS_PORT)")
    stack.add_argument("--run-dir", help="pid/log directory (STREAMRANK_RUN_DIR)")
    stack.add_argument(
        "--redis-cluster",
        action="store_true",
        help="`up`: a local Redis Cluster (3 masters, 1 replica each, on the Redis port and the "
        "5 above it) instead of one Redis; `down`/`status` find out by themselves",
    )
    stack.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for `up`")
    stack.set_defaults(
        func=_stack,
        setting_flags={
            "kafka_port": "STREAMRANK_STACK_KAFKA_PORT",
            "redis_port": "STREAMRANK_STACK_REDIS_PORT",
            "run_dir": "STREAMRANK_RUN_DIR",
        },
    )

    topics = sub.add_parser("topics", help="manage the engine's topics")
    topics.add_argument("action", choices=("create",))
    topics.add_argument("--partitions", type=int, help="partitions per topic (default: setting, 4)")
    topics.add_argument("--json", action="store_true")
    topics.set_defaults(func=_topics)
