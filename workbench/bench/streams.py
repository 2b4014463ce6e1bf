"""``streamrank bench streams``: feature worker throughput and click-to-visible latency.

One run, on the configured stack (or a private embedded one started on free ports when the
configured one does not answer):

1. produce ``--events`` clicks over ``--users`` Zipf-skewed users to a fresh topic;
2. ``raw_consume_per_s``: a plain aiokafka consumer reads and decodes that topic (the ceiling);
3. ``events_per_s``: one ``streamrank worker features`` process drains the same backlog into
   Redis (rate between its first and last applied event, from its /metrics), with its CPU time
   per event, the Redis servers' (``redis_cpu_us_per_event``; the script calls and the
   commands inside them, by command) and the host's busy cores meanwhile
   (``host_busy_cores``: on a small host the worker, Redis and the broker share the cores);
4. latency: clicks offered at ``--rate`` per second for ``--latency-seconds``; every
   ``--probe-every``-th click goes to a probe user of its own, and a poller records when it
   becomes visible in that user's sequence in Redis (``latency_p50_ms`` / ``latency_p99_ms``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from tqdm import tqdm

from schemas import Limits, decode_click
from streamrank import clock, keys
from streamrank.redis.client import redis_client, used_memory
from streamrank.runtime.tasks import cancel_and_wait
from streamrank.settings import Settings
from workbench.bench import compare
from workbench.bench.cpu import redis_usage, redis_usage_per_event
from workbench.bench.peers.run import peer_drain, require
from workbench.bench.streams_drain import cleanup, measure_drain, script_ab

logger = logging.getLogger(__name__)

CATEGORIES = ("action", "comedy", "drama", "horror", "romance", "sci-fi", "thriller")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=200_000, help="clicks in the backlog")
    parser.add_argument("--users", type=int, default=10_000, help="distinct users")
    parser.add_argument("--items", type=int, default=20_000, help="distinct items")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of users/items")
    parser.add_argument("--rate", type=float, default=5000.0, help="offered clicks/s (latency)")
    parser.add_argument("--latency-seconds", type=float, default=10.0, help="latency phase length")
    parser.add_argument("--probe-every", type=int, default=25, help="1 probe per N clicks")
    parser.add_argument("--path", choices=("batch", "agent"), default=None, help="features_path")
    parser.add_argument("--batch-size", type=int, default=None, help="features_batch_size")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--ab-script",
        action="store_true",
        help="also drain the backlog with the previous write contract (markers) and the current "
        "one (id_sets), back to back: script_ab",
    )
    parser.add_argument(
        "--peer",
        choices=("quix",),
        default=None,
        help="also drain the backlog with a Quix Streams application doing the same Redis work "
        "(needs pip install 'quixstreams==3.*'): peer",
    )
    compare.add_arguments(parser)


def zipf_choice(rng: np.random.Generator, n: int, size: int, s: float) -> np.ndarray:
    """``size`` draws from ranks 0..n-1 with P(rank k) proportional to 1 / (k + 1) ** s."""
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return rng.choice(n, size=size, p=weights / weights.sum())


def make_clicks(
    run: str, n: int, *, users: int, items: int, s: float, seed: int, start_ms: int
) -> list[tuple[bytes, bytes]]:
    """(key, value) of ``n`` Zipf-skewed clicks, event time increasing by 1 ms."""
    rng = np.random.default_rng(seed)
    user_ix = zipf_choice(rng, users, n, s)
    item_ix = zipf_choice(rng, items, n, s)
    out = []
    for i, (u, it) in enumerate(zip(user_ix.tolist(), item_ix.tolist(), strict=True)):
        user = f"{run}-u{u}"
        value = orjson.dumps(
            {
                "event_id": f"{run}-{seed}-{i:09d}",
                "user_id": user,
                "item_id": f"{run}-i{it}",
                "category": CATEGORIES[it % len(CATEGORIES)],
                "ts": start_ms + i,
            }
        )
        out.append((user.encode(), value))
    return out


async def produce_all(settings: Settings, topic: str, messages: list[tuple[bytes, bytes]]) -> float:
    producer = AIOKafkaProducer(
        **settings.kafka.client_kwargs(), acks="all", linger_ms=20, max_batch_size=512 * 1024
    )
    await producer.start()
    started = time.perf_counter()
    try:
        futures = []
        for key, value in tqdm(messages, desc="produce", unit="ev", mininterval=1.0):
            futures.append(await producer.send(topic, value, key=key))
            if len(futures) >= 20_000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.perf_counter() - started


async def raw_consume(settings: Settings, topic: str, expected: int) -> float:
    """Events/s of a plain aiokafka consumer reading and decoding ``topic`` from the start."""
    limits = Limits.from_settings(settings.limits)
    consumer = AIOKafkaConsumer(
        topic,
        **settings.kafka.client_kwargs(),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=16 * 1024 * 1024,
    )
    await consumer.start()
    seen = 0
    started = None
    try:
        deadline = time.monotonic() + 300
        while seen < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            if batch and started is None:
                started = time.perf_counter()
            for records in batch.values():
                for record in records:
                    decode_click(record.value, limits)
                seen += len(records)
        elapsed = time.perf_counter() - (started or time.perf_counter())
    finally:
        await consumer.stop()
    if seen < expected:
        raise RuntimeError(f"raw consumer read {seen} of {expected} events")
    return seen / max(elapsed, 1e-9)


def _samples(port: int) -> dict[str, float]:
    """The worker's /metrics samples without labels, by name."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels or set(sample.labels) == {"le"}:
                key = sample.name + (f"{{le={sample.labels['le']}}}" if sample.labels else "")
                out[key] = float(sample.value)
    return out


class ProbeWatch:
    """Probe clicks sent and not yet in their user's sequence, and, for those that are, the
    milliseconds from send to visible; :meth:`poll` runs until :attr:`done` and none pending."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self.pending: dict[int, tuple[str, str, float]] = {}  # probe -> (key, member, sent)
        self.latencies: list[float] = []
        self.done = asyncio.Event()

    def expect(self, probe: int, user: str, event_id: str) -> None:
        self.pending[probe] = (
            keys.sequence(user),
            keys.sequence_member(event_id, "p", None, "click"),  # the default action
            time.perf_counter(),
        )

    async def poll(self) -> None:
        while not (self.done.is_set() and not self.pending):
            if self.pending:
                items = list(self.pending.items())
                pipe = self._redis.pipeline(transaction=False)
                for _k, (seq_key, member, _t) in items:
                    pipe.zscore(seq_key, member)
                replies = await pipe.execute()
                now = time.perf_counter()
                for (k, (_s, _m, sent)), score in zip(items, replies, strict=True):
                    if score is not None:
                        self.latencies.append((now - sent) * 1000)
                        del self.pending[k]
            await asyncio.sleep(0.001)


async def offer(
    producer: AIOKafkaProducer,
    topic: str,
    run: str,
    background: list[tuple[bytes, bytes]],
    watch: ProbeWatch,
    *,
    rate: float,
    probe_every: int,
) -> tuple[int, float]:
    """``background`` at ``rate`` per second, a probe click before every ``probe_every``-th;
    returns the clicks sent (probes too) and the seconds it took."""
    tick = 0.01
    per_tick = rate * tick
    started = time.perf_counter()
    sent = 0
    probes = 0
    while sent < len(background):
        due = int((time.perf_counter() - started) / tick * per_tick) + 1
        while sent < min(due, len(background)):
            if sent % probe_every == 0:
                user = f"{run}-probe-{probes}"
                event_id = f"{run}-probe-{probes:07d}"
                now_ms = clock.now_ms()
                value = orjson.dumps(
                    {"event_id": event_id, "user_id": user, "item_id": "p", "ts": now_ms}
                )
                watch.expect(probes, user, event_id)
                await producer.send(topic, value, key=user.encode())
                probes += 1
            key, value = background[sent]
            await producer.send(topic, value, key=key)
            sent += 1
        await asyncio.sleep(tick / 2)
    return sent + probes, time.perf_counter() - started


async def measure_latency(
    settings: Settings, topic: str, run: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Offer clicks at ``args.rate``; time probes from send to visible in their sequence."""
    background = make_clicks(
        run,
        int(args.rate * args.latency_seconds),
        users=args.users,
        items=args.items,
        s=args.zipf,
        seed=args.seed + 1,
        start_ms=clock.now_ms(),
    )
    producer = AIOKafkaProducer(**settings.kafka.client_kwargs(), acks=1, linger_ms=0)
    client = redis_client(settings.redis, timeout_s=5)
    await producer.start()
    watch = ProbeWatch(client)
    poll_task = asyncio.create_task(watch.poll())
    try:
        offered, offered_s = await offer(
            producer, topic, run, background, watch, rate=args.rate, probe_every=args.probe_every
        )
        await producer.flush()
        watch.done.set()
        await asyncio.wait_for(poll_task, 60)
    finally:
        watch.done.set()
        await cancel_and_wait([poll_task], what="latency probes")
        await producer.stop()
        await client.aclose()
    arr = np.array(watch.latencies)
    return {
        "latency_offered_rate": round(offered / offered_s, 1),
        "latency_probes": int(arr.size),
        "latency_p50_ms": round(float(np.percentile(arr, 50)), 2),
        "latency_p99_ms": round(float(np.percentile(arr, 99)), 2),
        "latency_max_ms": round(float(arr.max()), 2),
    }


def bench_settings(settings: Settings, run: str, args: argparse.Namespace) -> Settings:
    """The run's own topics and features group, a free /metrics port, and the options."""
    from workbench.devstack.services import free_port

    overrides: dict[str, Any] = {
        "STREAMRANK_TOPIC_CLICKS": f"{run}-clicks",
        "STREAMRANK_TOPIC_DEAD_LETTERS": f"{run}-dead-letters",
        "STREAMRANK_FEATURES_APP_ID": f"{run}-features",
        "STREAMRANK_METRICS_PORT": free_port(),
    }
    if args.path:
        overrides["STREAMRANK_FEATURES_PATH"] = args.path
    if args.batch_size:
        overrides["STREAMRANK_FEATURES_BATCH_SIZE"] = args.batch_size
    return settings.with_env(**overrides)


async def _bench(settings: Settings, args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    from streamrank.kafka.topics import create_topics
    from workbench.devstack.processes import start_worker

    if args.peer:
        require(args.peer)  # before anything is produced
    run = f"bench-{uuid.uuid4().hex[:8]}"
    settings = bench_settings(settings, run, args)
    await create_topics(settings, topics=(settings.topics.clicks, settings.topics.dead_letters))
    messages = make_clicks(
        run,
        args.events,
        users=args.users,
        items=args.items,
        s=args.zipf,
        seed=args.seed,
        start_ms=clock.now_ms() - args.events,
    )
    produce_s = await produce_all(settings, settings.topics.clicks, messages)
    cpu0 = time.process_time()
    raw = await raw_consume(settings, settings.topics.clicks, args.events)
    raw_cpu_us = (time.process_time() - cpu0) / args.events * 1e6
    extra: dict[str, Any] = {}
    if args.ab_script:
        extra["script_ab"] = await script_ab(
            settings, run, expected=args.events, work_dir=work_dir, raw_cpu_us=raw_cpu_us
        )
    if args.peer:
        extra["peer"] = await peer_drain(
            settings, run, args.peer, expected=args.events, work_dir=work_dir, raw_cpu_us=raw_cpu_us
        )
        await cleanup(settings, run)
    memory_client = redis_client(settings.redis, timeout_s=10)
    memory_before = await used_memory(memory_client)
    redis_before = await redis_usage(memory_client)
    worker = start_worker(
        "features", settings, log_path=work_dir / f"{run}-worker.log", metrics_port=None
    )
    try:
        await asyncio.to_thread(worker.wait_ready, 120)
        drain = await measure_drain(
            worker.pid, settings.observability.metrics_port or 0, args.events
        )
        redis_side = redis_usage_per_event(
            redis_before, await redis_usage(memory_client), args.events
        )
        memory = await used_memory(memory_client) - memory_before
        await memory_client.aclose()
        latency = await latency_and_batches(settings, run, args)
    finally:
        worker.stop()
    deleted = await cleanup(settings, run)
    return {
        "events": args.events,
        "users": args.users,
        "items": args.items,
        "zipf": args.zipf,
        "partitions": settings.topics.partitions,
        "features_path": settings.features.path,
        "batch_size": settings.features.batch_size,
        "produce_per_s": round(args.events / produce_s, 1),
        "raw_consume_per_s": round(raw, 1),
        "raw_consume_cpu_us_per_event": round(raw_cpu_us, 1),
        "events_per_s": round(drain["events_per_s"], 1),
        "events_per_s_vs_raw": round(drain["events_per_s"] / raw, 3),
        "worker_cpu_us_per_event": round(drain["worker_cpu_us_per_event"], 1),
        **redis_side,
        "host_busy_cores": round(drain["host_busy_cores"], 2),
        **latency,
        "redis": settings.redis.mode,
        **memory_figures(memory, users=len({key for key, _value in messages}), events=args.events),
        "goal_events_per_s_25000": drain["events_per_s"] >= 25_000,
        "goal_latency_p99_50ms": latency["latency_p99_ms"] <= 50,
        "redis_keys_cleaned": deleted,
        "cpu_count": os.cpu_count(),
        "write_contract": settings.features.write_contract,
        **extra,
    }


async def latency_and_batches(
    settings: Settings, run: str, args: argparse.Namespace
) -> dict[str, Any]:
    """The latency phase, with the worker's batches meanwhile and their mean append time."""
    port = settings.observability.metrics_port or 0
    before = await asyncio.to_thread(_samples, port)
    latency = await measure_latency(settings, settings.topics.clicks, run, args)
    after = await asyncio.to_thread(_samples, port)
    name = "streamrank_features_append_to_durable_seconds"
    batches = after[f"{name}_count"] - before[f"{name}_count"]
    latency["worker_batches"] = int(batches)
    latency["worker_append_to_durable_mean_ms"] = round(
        (after[f"{name}_sum"] - before[f"{name}_sum"]) / max(batches, 1) * 1000, 2
    )
    return latency


def memory_figures(memory: float, *, users: int, events: int) -> dict[str, float]:
    """used_memory (summed over masters) grown by the backlog's keys: the users' sequences,
    counters and dedupe markers (both sides), and the item counters."""
    return {
        "redis_bytes_per_user": round(memory / users, 1),
        "redis_bytes_per_event": round(memory / events, 1),
    }


FIGURES = (
    "events_per_s",
    "worker_cpu_us_per_event",
    "latency_p50_ms",
    "latency_p99_ms",
    "redis_bytes_per_user",
    "redis_bytes_per_event",
)


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """Run the benchmark; start a private embedded stack when the configured one is down."""
    from workbench.devstack.pipeline import stack_or_private

    if args.compare_cluster:

        def one(kind_settings: Settings, work_dir: Path) -> dict[str, Any]:
            work_dir.mkdir(parents=True, exist_ok=True)
            return asyncio.run(_bench(kind_settings, args, work_dir))

        return compare.compare_cluster(settings, one, runs=args.runs, figures=FIGURES)

    with (
        tempfile.TemporaryDirectory(
            prefix="streamrank-bench-streams-", ignore_cleanup_errors=True
        ) as tmp,
        stack_or_private(settings, run_dir=Path(tmp), say=logger.info) as (settings, stack),
    ):
        result = asyncio.run(_bench(settings, args, Path(tmp)))
    result["private_stack"] = stack is not None
    return result
