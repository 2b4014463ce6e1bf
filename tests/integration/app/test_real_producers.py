"""Real upstream producers (librdkafka through confluent-kafka): every codec, headers,
transactions, and batches no client can decode. Both workers run as processes on the embedded
broker and Redis and must still be running at the end."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from schemas import decode_dead_letter, decode_result
from streamrank import keys
from streamrank.kafka.topics import create_topics
from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from tests.integration.support.features import metric, poll, scrape, sequence_members
from tests.integration.support.kafka import (
    Message,
    garbled_gzip_batch,
    in_thread,
    librdkafka_produce,
    librdkafka_read,
    produce_raw_batch,
)
from tests.integration.support.scoring import item_ids, publish
from workbench.devstack.processes import WorkerProcess, start_worker
from workbench.devstack.services import free_port

pytestmark = pytest.mark.timeout(240)

CODECS = ("gzip", "snappy", "lz4", "zstd")


@pytest.fixture
def artifact(tiny_artifacts: tuple[Path, Path]) -> Path:
    return tiny_artifacts[0]


class Workers:
    def __init__(self, settings: Settings, logs: Path) -> None:
        self.settings = settings
        self.features_port, self.scoring_port = free_port(), free_port()
        self.features: WorkerProcess = start_worker(
            "features", settings, log_path=logs / "features.log", metrics_port=self.features_port
        )
        self.scoring: WorkerProcess = start_worker(
            "scoring", settings, log_path=logs / "scoring.log", metrics_port=self.scoring_port
        )

    def wait_ready(self) -> None:
        self.features.wait_ready(90)
        self.scoring.wait_ready(90)

    def assert_alive(self) -> None:
        for handle in (self.features, self.scoring):
            assert handle.alive(), f"worker died; log ends:\n{handle.log_text()[-3000:]}"

    def stop(self) -> None:
        for handle in (self.features, self.scoring):
            handle.stop()


@pytest.fixture
async def workers(
    make_settings: Callable[..., Settings], unique: str, artifact: Path, tmp_path: Path
) -> Iterator[Workers]:
    settings = make_settings(
        STREAMRANK_FEATURES_APP_ID=f"features-{unique}",
        STREAMRANK_SCORING_GROUP_ID=f"scoring-{unique}",
        STREAMRANK_SCORING_BUDGET_MS=10_000,
        STREAMRANK_KAFKA_COMPRESSION="lz4",  # our own producers compress too: consumers must read it
    )
    await create_topics(settings)
    redis = redis_client(settings.redis)
    try:
        await redis.set(keys.active_model(), await publish(redis, artifact))
    finally:
        await redis.aclose()
    running = Workers(settings, tmp_path)
    try:
        await asyncio.to_thread(running.wait_ready)
        yield running
    finally:
        running.stop()


def click(event_id: str, user: str, item: str, **extra: object) -> bytes:
    body = {"event_id": event_id, "user_id": user, "item_id": item, "ts": int(time.time() * 1000)}
    return orjson.dumps({**body, **extra})


async def test_every_codec_with_headers_is_applied_answered_and_dead_lettered(
    workers: Workers, unique: str, artifact: Path
) -> None:
    s = workers.settings
    items = item_ids(artifact)[:20]
    users = {codec: f"u-{codec}-{unique}" for codec in CODECS}
    for codec in CODECS:
        user = users[codec]
        trace = [("traceparent", f"00-{codec}-{unique}".encode()), ("binary", b"\xff\x00")]
        clicks = [
            (user.encode(), click(f"{codec}-{i}-{unique}", user, items[i]), trace)
            for i in range(10)
        ]
        # The poison pill that crashed the features worker: "action" is an object.
        clicks.append((user.encode(), click(f"{codec}-bad-{unique}", user, "i", action={}), trace))
        requests = [
            (
                user.encode(),
                orjson.dumps(
                    {"request_id": f"r-{codec}-{i}-{unique}", "user_id": user, "items": items}
                ),
                trace,
            )
            for i in range(5)
        ]
        requests.append(
            (
                user.encode(),
                orjson.dumps(
                    {"request_id": f"r-{codec}-bad-{unique}", "user_id": user, "items": {}}
                ),
                trace,
            )
        )
        assert (
            await in_thread(
                librdkafka_produce, s.kafka.bootstrap, s.topics.clicks, clicks, codec=codec
            )
            == 11
        )
        assert (
            await in_thread(
                librdkafka_produce, s.kafka.bootstrap, s.topics.requests, requests, codec=codec
            )
            == 6
        )

    async def all_applied() -> bool:
        members = await sequence_members(s, users.values())
        return all(len(m) == 10 for m in members.values())

    await poll(all_applied, timeout_s=60, what="10 clicks of each codec in the sequences")

    # `streamrank tail` reads records of every codec (and prints the poison pills too)
    shown = await in_thread(
        subprocess.run,
        [sys.executable, "-m", "workbench.cli", "tail", s.topics.clicks, "--from-beginning",
         "--json"],
        capture_output=True, env={**os.environ, **s.as_env()}, check=True, timeout=120,
    )  # fmt: skip
    tailed = [orjson.loads(line)["value"] for line in shown.stdout.splitlines()]
    for codec in CODECS:
        mine = [v for v in tailed if v["user_id"] == users[codec]]
        assert len(mine) == 11, (codec, len(mine))
    assert b"44 messages read" in shown.stderr and b"not valid JSON" not in shown.stderr

    # Replies and dead letters were produced lz4-compressed by our workers; librdkafka (an
    # independent client) reads them.
    replies = await in_thread(librdkafka_read, s.kafka.bootstrap, s.topics.results, want=24)
    results = {r.request_id: r for r in (decode_result(m.value()) for m in replies)}
    for codec in CODECS:
        for i in range(5):
            result = results[f"r-{codec}-{i}-{unique}"]
            assert result.user_id == users[codec] and len(result.scores) == len(items)
        assert results[f"r-{codec}-bad-{unique}"].reason.startswith("invalid_request")
    letters = [
        decode_dead_letter(m.value())
        for m in await in_thread(librdkafka_read, s.kafka.bootstrap, s.topics.dead_letters, want=8)
    ]
    assert len(letters) == 8
    for codec in CODECS:
        mine = [letter for letter in letters if codec in letter.payload]
        assert sorted(letter.source_topic for letter in mine) == sorted(
            [s.topics.clicks, s.topics.requests]
        )
        for letter in mine:
            assert letter.reason == "bad_type"
            headers = dict(letter.original_headers())
            assert headers == {
                "traceparent": f"00-{codec}-{unique}".encode(),
                "binary": b"\xff\x00",
            }
    workers.assert_alive()


async def test_an_undecodable_batch_is_skipped_with_a_dead_letter_and_the_partition_moves_on(
    workers: Workers, unique: str, artifact: Path
) -> None:
    s = workers.settings
    user = f"u-poison-{unique}"
    items = item_ids(artifact)[:5]
    bad_clicks = garbled_gzip_batch(
        [click(f"lost-{i}", user, "i") for i in range(3)], key=user.encode()
    )
    bad_requests = garbled_gzip_batch([b"{}"] * 4, key=user.encode())
    await produce_raw_batch(s.kafka.bootstrap, s.topics.clicks, 0, bad_clicks)
    await produce_raw_batch(s.kafka.bootstrap, s.topics.requests, 0, bad_requests)
    after_clicks = [
        (user.encode(), click(f"after-{i}-{unique}", user, items[i]), []) for i in range(3)
    ]
    after_requests = [
        (
            user.encode(),
            orjson.dumps({"request_id": f"r-after-{i}-{unique}", "user_id": user, "items": items}),
            [],
        )
        for i in range(3)
    ]
    # Same partition as the broken batches, after them: they only arrive if the worker moved on.
    await in_thread(
        librdkafka_produce,
        s.kafka.bootstrap,
        s.topics.clicks,
        after_clicks,
        codec="none",
        partition=0,
    )
    await in_thread(
        librdkafka_produce,
        s.kafka.bootstrap,
        s.topics.requests,
        after_requests,
        codec="none",
        partition=0,
    )

    async def applied() -> bool:
        return len((await sequence_members(s, [user]))[user]) == 3

    await poll(applied, timeout_s=60, what="the clicks after the broken batch")
    replies = await in_thread(librdkafka_read, s.kafka.bootstrap, s.topics.results, want=3)
    assert {decode_result(m.value()).request_id for m in replies} >= {
        f"r-after-{i}-{unique}" for i in range(3)
    }
    letters = [
        decode_dead_letter(m.value())
        for m in await in_thread(librdkafka_read, s.kafka.bootstrap, s.topics.dead_letters, want=2)
    ]
    by_topic = {
        letter.source_topic: letter for letter in letters if letter.reason == "undecodable_batch"
    }
    assert set(by_topic) == {s.topics.clicks, s.topics.requests}
    assert by_topic[s.topics.clicks].partition == 0
    assert "offsets 0-2 skipped" in by_topic[s.topics.clicks].error
    assert "offsets 0-3 skipped" in by_topic[s.topics.requests].error
    features = await in_thread(scrape, workers.features_port)
    scoring = await in_thread(scrape, workers.scoring_port)
    assert metric(features, "streamrank_features_skipped_records_total") == 3
    assert (
        metric(features, "streamrank_features_dead_letters_total", reason="undecodable_batch") == 1
    )
    assert metric(scoring, "streamrank_scoring_skipped_requests_total") == 4
    workers.assert_alive()


async def test_both_workers_consume_with_the_isolation_level_setting(workers: Workers) -> None:
    # Logged from the consumers the workers actually built (Faust's included, which would read
    # uncommitted by itself).
    assert "features consumer: isolation_level read_committed" in workers.features.log_text()
    assert (
        "(isolation_level read_committed, replies compressed with lz4)"
        in workers.scoring.log_text()
    )


def transactional_produce(
    bootstrap: str, topic: str, aborted: list[Message], committed: list[Message]
) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"tx-{topic}",
            "compression.type": "zstd",
        }
    )
    producer.init_transactions(30)
    for batch, commit in ((aborted, False), (committed, True)):
        producer.begin_transaction()
        for key, value, headers in batch:
            producer.produce(topic, value, key=key, headers=list(headers))
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)


def broker_filters_aborted(bootstrap: str, topic: str, unique: str) -> bool | None:
    """Whether the broker hides aborted transactions from a read_committed consumer (librdkafka,
    not ours: the answer must not depend on the code under test); None when it cannot tell: the
    probe read no committed record in time (a loaded host), or the aborted record never reached
    the log (then hiding it proves nothing; seen once on Tansu, where a record produced to a
    topic still being created was acknowledged and then missing)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    probe = f"{topic}-probe"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: the futures need its handle
    admin.create_topics([NewTopic(probe, 1, 1)])[probe].result(30)
    transactional_produce(bootstrap, probe, [(None, b"aborted", [])], [(None, b"committed", [])])
    in_log = read_until_committed(bootstrap, probe, unique, "read_uncommitted")
    if in_log is None or b"aborted" not in in_log:
        return None
    seen = read_until_committed(bootstrap, probe, unique, "read_committed")
    if seen is None:
        return None
    return b"aborted" not in seen


def read_until_committed(
    bootstrap: str, topic: str, unique: str, isolation: str
) -> list[bytes] | None:
    """The values a fresh consumer with this isolation level reads from the start of `topic` up
    to the record b"committed"; None when that record is not read within 15 s."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as CTopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{isolation}-{unique}",
            "isolation.level": isolation,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([CTopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        seen: list[bytes] = []
        deadline = time.monotonic() + 15
        while b"committed" not in seen and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                seen.append(message.value())
        return seen if b"committed" in seen else None
    finally:
        consumer.close()


async def test_aborted_transactions_never_become_features(workers: Workers, unique: str) -> None:
    s = workers.settings
    filters = await in_thread(broker_filters_aborted, s.kafka.bootstrap, s.topics.clicks, unique)
    if filters is None:
        pytest.skip(
            "the broker probe could not tell: it read no committed record within 15 s, or the "
            "aborted record it produced never reached the log"
        )
    if not filters:
        pytest.skip(
            "the broker returns aborted transactions to read_committed consumers (the embedded "
            "Tansu broker sends no aborted-transaction index in Fetch responses), so isolation "
            "cannot be shown here; the setting's pass-through is tested beside this test. Run "
            "with STREAMRANK_TEST_KAFKA_BOOTSTRAP set to a real Kafka to run it."
        )
    user = f"u-tx-{unique}"
    aborted = [(user.encode(), click(f"aborted-{i}-{unique}", user, "i"), []) for i in range(3)]
    committed = [(user.encode(), click(f"committed-{i}-{unique}", user, "i"), []) for i in range(3)]
    await in_thread(transactional_produce, s.kafka.bootstrap, s.topics.clicks, aborted, committed)

    async def applied() -> list[str]:
        return (await sequence_members(s, [user]))[user]

    members = await poll(applied, timeout_s=60, what="the committed transaction's clicks")
    await asyncio.sleep(2)
    members = await applied()
    assert sorted(members) == sorted(f"committed-{i}-{unique}" for i in range(3))
