"""``RankClient``: rank from an asyncio service through the broker.

One producer for requests and one shared reply consumer (no consumer group: it reads every
partition of the reply topic from the end, so any number of clients can share the topic);
replies are matched to waiting callers by request_id, and duplicates (at-least-once) dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from schemas import DEFAULT_SCENE, RankRequest, RankResult, decode_result, is_error_reply
from streamrank.errors import ContractError, KafkaUnavailable, StreamrankError
from streamrank.kafka import clients as kafka
from streamrank.kafka.fetch_wait import FetchWait
from streamrank.runtime import tasks
from streamrank.settings import Settings

logger = logging.getLogger(__name__)


class RankTimeout(StreamrankError):
    """No reply within the timeout: is a scoring worker running (`streamrank worker scoring`)?"""

    retriable = True


class RankRejected(StreamrankError):
    """The worker refused the request (invalid, or reply_to not allowed); do not retry as is."""

    def __init__(self, message: str, *, result: RankResult) -> None:
        super().__init__(message)
        self.result = result


def build_request(
    user_id: str,
    items: Sequence[str] | None,
    *,
    context: dict[str, Any] | None = None,
    top_k: int | None = None,
    scene: str | None = None,
    exclude: Sequence[str] | None = None,
    deadline_ms: int | None = None,
    request_id: str | None = None,
    ts: int | None = None,
    reply_to: str | None = None,
) -> RankRequest:
    """The request :meth:`RankClient.rank` sends (a new request_id unless given). Raises
    ValueError for an empty ``items``: an empty candidate list is more likely a caller's bug
    than a wish to retrieve, which ``items=None`` says."""
    for name, ids in (("items", items), ("exclude", exclude)):
        if isinstance(ids, str):
            raise TypeError(f"{name} must be a sequence of ids, not the string {ids[:40]!r}")
    if items is not None and not items:
        raise ValueError(
            "items is empty: pass candidates, or items=None to have the engine retrieve them"
        )
    return RankRequest(
        request_id=request_id or uuid.uuid4().hex,
        user_id=user_id,
        items=tuple(items or ()),
        context=context,
        deadline_ms=deadline_ms,
        reply_to=reply_to,
        ts=ts,
        top_k=top_k,
        scene=DEFAULT_SCENE if scene is None else scene,
        exclude=tuple(exclude or ()),
    )


class RankClient:
    """``async with RankClient(settings=s) as c: result = await c.rank("u1", ["a", "b"])``;
    ``await c.rank("u1", top_k=10)`` retrieves."""

    def __init__(
        self, *, settings: Settings, reply_topic: str | None = None, default_timeout_s: float = 5.0
    ) -> None:
        self._settings = settings
        self._reply_topic = reply_topic or settings.topics.results
        self._default_timeout_s = default_timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._pending: dict[str, asyncio.Future[RankResult]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._reader_error: KafkaUnavailable | None = None
        self.duplicates = 0  # replies for requests no longer waiting (answered twice, or timed out)

    async def start(self) -> None:
        s = self._settings
        self._producer = kafka.producer(s.kafka, acks="all", linger_ms=0)
        self._consumer = kafka.consumer(
            s.kafka,
            enable_auto_commit=False,
            fetch_max_wait_ms=s.scoring.fetch_wait_ms,
        )
        try:
            await self._producer.start()
            await self._consumer.start()
            partitions = self._consumer.partitions_for_topic(self._reply_topic)
            if not partitions:
                await self._consumer._client.force_metadata_update()  # topic created after start
                partitions = self._consumer.partitions_for_topic(self._reply_topic)
            if not partitions:
                raise KafkaUnavailable(
                    f"reply topic {self._reply_topic!r} does not exist; "
                    "run `streamrank topics create`"
                )
            tps = [TopicPartition(self._reply_topic, p) for p in sorted(partitions)]
            self._consumer.assign(tps)
            await self._consumer.seek_to_end(*tps)
            for tp in tps:  # resolve the end offsets now, so no reply to a later request is skipped
                await self._consumer.position(tp)
        except KafkaError as exc:
            await self.stop()
            raise KafkaUnavailable(f"cannot reach Kafka at {s.kafka.bootstrap}: {exc}") from exc
        self._reader = asyncio.create_task(self._read_replies(), name="rank-client-replies")

    async def stop(self) -> None:
        if self._reader is not None:
            await tasks.cancel_and_wait([self._reader], what="rank client")
            self._reader = None
        for client in (self._consumer, self._producer):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.stop()
        self._consumer = self._producer = None
        for future in self._pending.values():
            if not future.done():
                future.cancel()
        self._pending.clear()

    async def __aenter__(self) -> RankClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _read_replies(self) -> None:
        assert self._consumer is not None
        fetch = FetchWait(self._consumer, floor_ms=self._settings.scoring.fetch_wait_ms)
        try:
            while True:
                batches = await fetch.getmany(timeout_ms=500)
                for records in batches.values():
                    for record in records:
                        self._deliver(record.value)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Without the reader no reply can arrive: say why now, to every waiting caller and
            # to every later one, instead of letting them all run into RankTimeout.
            logger.exception("the reply reader on %s stopped", self._reply_topic)
            self._reader_error = KafkaUnavailable(
                f"the RankClient's reply reader on {self._reply_topic!r} stopped: {exc!r}; "
                "create a new client"
            )
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(self._reader_error)
            self._pending.clear()

    def _deliver(self, raw: bytes | None) -> None:
        try:
            result = decode_result(raw or b"")
        except ContractError as exc:
            logger.warning("ignoring an unreadable reply on %s: %s", self._reply_topic, exc)
            return
        future = self._pending.pop(result.request_id, None)
        if future is None or future.done():
            self.duplicates += 1
            return
        future.set_result(result)

    async def send(self, request: RankRequest) -> asyncio.Future[RankResult]:
        """Produce one request and return the future its reply will complete."""
        if self._producer is None:
            raise StreamrankError("RankClient is not started: use `async with RankClient(...)`")
        if self._reader_error is not None:
            raise self._reader_error
        future: asyncio.Future[RankResult] = asyncio.get_running_loop().create_future()
        self._pending[request.request_id] = future
        try:
            await self._producer.send_and_wait(
                self._settings.topics.requests, request.to_json(), key=request.user_id.encode()
            )
        except KafkaError as exc:
            self._pending.pop(request.request_id, None)
            raise KafkaUnavailable(f"could not send the rank request: {exc}") from exc
        except BaseException:  # cancelled while sending: forget the request
            self._pending.pop(request.request_id, None)
            raise
        return future

    async def rank(
        self,
        user_id: str,
        items: Sequence[str] | None = None,
        context: dict[str, Any] | None = None,
        *,
        top_k: int | None = None,
        scene: str | None = None,
        exclude: Sequence[str] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the documented API
        deadline_ms: int | None = None,
        request_id: str | None = None,
        ts: int | None = None,
    ) -> RankResult:
        """Rank ``items`` for ``user_id``, or (``items`` None) have the engine retrieve the
        candidates; ``top_k``: only the best, sorted best first; ``scene``: its rules (default
        ``"default"``); ``exclude``: items never to return. Features are as of ``ts`` (epoch ms;
        default the request's Kafka timestamp). Raises :class:`RankTimeout` or
        :class:`RankRejected`."""
        timeout_s = self._default_timeout_s if timeout is None else timeout
        request = build_request(
            user_id,
            items,
            context=context,
            top_k=top_k,
            scene=scene,
            exclude=exclude,
            deadline_ms=deadline_ms,
            request_id=request_id,
            ts=ts,
            reply_to=self._reply_topic
            if self._reply_topic != self._settings.topics.results
            else None,
        )
        started = time.monotonic()
        future = await self.send(request)
        try:
            result = await asyncio.wait_for(
                future, max(0.0, timeout_s - (time.monotonic() - started))
            )
        except TimeoutError:
            self._pending.pop(request.request_id, None)
            raise RankTimeout(
                f"no reply to request {request.request_id} within {timeout_s:.1f}s on "
                f"{self._reply_topic!r}; is a scoring worker running (`streamrank worker scoring`) "
                f"and consuming {self._settings.topics.requests!r}?"
            ) from None
        if is_error_reply(result):
            raise RankRejected(
                f"request {request.request_id} refused: {result.reason}", result=result
            )
        return result
