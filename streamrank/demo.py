"""``streamrank demo``: the whole pipeline on the embedded stack, until Ctrl-C (or --duration).

It starts the stack (unless one already answers), creates the topics, then runs the pipeline
stages that exist and prints what flows through them. On exit it stops exactly what it started.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from schemas import ClickEvent, decode_click
from streamrank.settings import Settings

logger = logging.getLogger(__name__)


def synthetic_clicks(
    n: int, *, users: int, items: int, seed: int, start_ms: int
) -> list[ClickEvent]:
    """Zipf-skewed clicks over ``users`` x ``items`` with increasing event time."""
    rng = random.Random(seed)
    categories = ("action", "comedy", "drama", "horror", "romance", "sci-fi")
    out = []
    for i in range(n):
        item = min(int(rng.paretovariate(1.1)), items) - 1
        out.append(
            ClickEvent(
                event_id=f"demo-{seed}-{i:09d}",
                user_id=f"u{rng.randrange(users)}",
                item_id=f"i{item}",
                category=categories[item % len(categories)],
                ts=start_ms + i,
            )
        )
    return out


async def _kafka_roundtrip(settings: Settings, *, duration_s: float | None, rate: float) -> None:
    """Produce clicks and read them back: the broker path the later stages build on."""
    producer = AIOKafkaProducer(**settings.kafka_client_kwargs(), acks="all", linger_ms=5)
    consumer = AIOKafkaConsumer(
        settings.topic_clicks,
        **settings.kafka_client_kwargs(),
        group_id=f"streamrank-demo-{int(time.time())}",
        auto_offset_reset="latest",
        enable_auto_commit=False,
    )
    await producer.start()
    await consumer.start()
    produced = consumed = 0
    seed = int(time.time())
    started = time.monotonic()
    last_report = started
    try:
        while duration_s is None or time.monotonic() - started < duration_s:
            batch = synthetic_clicks(
                max(1, int(rate)),
                users=100,
                items=1000,
                seed=seed + produced,
                start_ms=int(time.time() * 1000),
            )
            for event in batch:
                await producer.send(
                    settings.topic_clicks, event.to_json(), key=event.user_id.encode()
                )
            await producer.flush()
            produced += len(batch)
            records = await consumer.getmany(timeout_ms=1000)
            for messages in records.values():
                for message in messages:
                    decode_click(message.value)
                    consumed += 1
            if time.monotonic() - last_report >= 2:
                last_report = time.monotonic()
                print(f"demo: produced {produced} clicks, consumed {consumed} back from the broker")
    finally:
        await consumer.stop()
        await producer.stop()


async def run_demo(settings: Settings, *, duration_s: float | None, rate: float) -> None:
    from streamrank.topics import create_topics

    topics = await create_topics(settings)
    print("topics: " + ", ".join(f"{t} ({s})" for t, s in topics.items()))
    await _kafka_roundtrip(settings, duration_s=duration_s, rate=rate)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from streamrank.cli import run_until_signalled
    from streamrank.cli_stack import stack_from

    stack = stack_from(settings)
    status = stack.status()
    we_started = not (status["kafka"]["up"] and status["redis"]["up"])
    if we_started:
        print("demo: starting the embedded stack ...")
        stack.up()
    else:
        print("demo: using the stack that is already up")
    status = stack.status()
    print(
        f"kafka {status['kafka']['bootstrap']} up={status['kafka']['up']}; "
        f"redis {status['redis']['url']} up={status['redis']['up']}"
    )
    print("demo: running; press Ctrl-C to stop")
    try:
        run_until_signalled(run_demo(settings, duration_s=args.duration, rate=args.rate))
        print("\ndemo: shutting down")
    finally:
        if we_started:
            with contextlib.suppress(KeyboardInterrupt):
                stopped = stack.down()
                print("demo: stopped " + ", ".join(stopped))
    return 0


def register(sub: Any) -> None:
    demo = sub.add_parser("demo", help="run the whole pipeline on the embedded stack")
    demo.add_argument(
        "--duration", type=float, default=None, help="seconds to run (default: until Ctrl-C)"
    )
    demo.add_argument("--rate", type=float, default=200.0, help="clicks produced per second")
    demo.set_defaults(func=_demo)
