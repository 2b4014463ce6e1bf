"""The peer of ``bench streams --peer quix``: a Quix Streams application doing the features
worker's per-event Redis work, run as a child process (``python -m
workbench.bench.peers.quix_streams``).

What a Python user would write instead of streamrank's worker: a ``StreamingDataFrame`` over
the clicks topic and a ``BatchingSink`` that, at each checkpoint, pipelines per event the same
commands as the ``markers`` script (both markers with their TTLs, ZADD + ZREMRANGEBYRANK +
PEXPIRE of the sequence, the five HINCRBYs and their buckets' PEXPIREAT) in one round trip per
partition. A pipeline cannot gate an event's effects on its marker, so this peer does the
work but is not idempotent: it is the cheaper side of the comparison.

It drains ``--events`` records from the start and writes ``{"events", "seconds",
"cpu_seconds"}`` (first record seen to last write, the process' CPU meanwhile) to ``--out``.
Quix Streams is not a dependency of streamrank: ``pip install 'quixstreams==3.*'``.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path
from typing import Any

import orjson
import redis

from streamrank import clock, keys
from streamrank.settings import Settings, get_settings
from streams.windows import bucket_expire_at_ms, bucket_start, windows_from_settings


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread: librdkafka's too
    return usage.ru_utime + usage.ru_stime


class Progress:
    """When the first record was seen, how many events were written, and the CPU meanwhile."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.written = 0
        self.first: float | None = None
        self.cpu0 = 0.0
        self.result: dict[str, float] = {}

    def seen(self, value: Any) -> None:
        if self.first is None:
            self.first, self.cpu0 = time.perf_counter(), _cpu_seconds()

    def done(self, n: int) -> bool:
        self.written += n
        if self.written < self.expected or self.result:
            return False
        self.result = {
            "events": self.written,
            "seconds": time.perf_counter() - (self.first or 0.0),
            "cpu_seconds": _cpu_seconds() - self.cpu0,
        }
        return True


def event_commands(pipe: Any, event: dict[str, Any], settings: Settings, now_ms: int) -> None:
    """The per-event commands of the ``markers`` script, queued on ``pipe``."""
    f = settings.features
    user, item, ts, event_id = event["user_id"], event["item_id"], event["ts"], event["event_id"]
    shard = keys.item_shard(item)
    pipe.set(keys.seen(user, event_id), 1, nx=True, px=f.dedupe_ttl_s * 1000)
    member = keys.sequence_member(event_id, item, event.get("category"), event.get("action", "click"))  # fmt: skip
    sequence = keys.sequence(user)
    pipe.zadd(sequence, {member: ts})
    pipe.zremrangebyrank(sequence, 0, -f.sequence_length - 1)
    pipe.pexpire(sequence, f.sequence_ttl_s * 1000)
    last = 0
    for window in windows_from_settings(f):
        start = bucket_start(ts, window.resolution_s)
        expire = bucket_expire_at_ms(start, window, f.counter_lateness_s)
        if expire <= now_ms:
            continue
        last = max(last, expire)
        user_bucket = keys.user_counter_bucket(user, window.resolution_s, start)
        item_bucket = keys.item_counter_bucket(shard, window.resolution_s, start)
        pipe.hincrby(user_bucket, "n", 1)
        if window.resolution_s == f.counter_coarse_bucket_s and event.get("category"):
            pipe.hincrby(user_bucket, keys.category_field(event["category"]), 1)
        pipe.hincrby(item_bucket, item, 1)
        pipe.pexpireat(user_bucket, expire)
        pipe.pexpireat(item_bucket, expire)
    if last:
        until = min(last, now_ms + f.dedupe_ttl_s * 1000)
        pipe.set(keys.item_seen(shard, event_id), 1, nx=True, pxat=until)


def main() -> None:
    from quixstreams import Application
    from quixstreams.sinks import BatchingSink, SinkBatch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    settings = get_settings()
    client = redis.Redis.from_url(settings.redis.url.get_secret_value())
    progress = Progress(args.events)
    app = Application(
        broker_address=settings.kafka.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        auto_create_topics=False,
        loglevel="WARNING",
    )

    class RedisFeatures(BatchingSink):
        def write(self, batch: SinkBatch) -> None:
            pipe = client.pipeline(transaction=False)
            now_ms = clock.now_ms()
            n = 0
            for item in batch:
                event_commands(pipe, item.value, settings, now_ms)
                n += 1
            pipe.execute()
            if progress.done(n):
                app.stop()

    topic = app.topic(settings.topics.clicks, value_deserializer="json", key_deserializer="bytes")
    sdf = app.dataframe(topic)
    sdf = sdf.update(progress.seen)
    sdf.sink(RedisFeatures())
    app.run()
    args.out.write_bytes(orjson.dumps(progress.result))


if __name__ == "__main__":
    main()
