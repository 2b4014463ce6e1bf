"""/healthz and /readyz: 200 only when the loop beats and every readiness check passes; 503
with a JSON body saying which check fails, served beside /metrics."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter

from streamrank.runtime.health import Health, ping, watch
from streamrank.runtime.metrics_http import wsgi_app


def get(app: Any, path: str) -> tuple[str, Any]:
    answer: dict[str, str] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        answer["status"] = status

    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": "GET", "QUERY_STRING": ""},
                        start_response))  # fmt: skip
    return answer["status"], body


def test_readiness_waits_for_every_check_and_says_which_fails() -> None:
    health = Health(("group", "redis"))
    app = wsgi_app(CollectorRegistry(), health)
    status, body = get(app, "/readyz")
    assert status.startswith("503")
    assert orjson.loads(body)["checks"]["group"] == {"ok": False, "detail": "not yet"}
    health.set("group", True, "4 partitions")
    health.set("redis", True, "PING 0.2 ms")
    status, body = get(app, "/readyz")
    assert status.startswith("200") and orjson.loads(body)["status"] == "ready"
    health.set("redis", False, "no answer")
    assert get(app, "/readyz")[0].startswith("503")
    assert get(app, "/healthz")[0].startswith("200")  # alive, only not ready


def test_a_stalled_loop_fails_liveness_and_readiness() -> None:
    health = Health(("group",), stall_s=0.05)
    health.set("group", True)
    app = wsgi_app(CollectorRegistry(), health)
    assert get(app, "/healthz")[0].startswith("200")
    time.sleep(0.1)
    status, body = get(app, "/healthz")
    assert status.startswith("503") and orjson.loads(body)["status"] == "stalled"
    assert orjson.loads(get(app, "/readyz")[1])["checks"]["event_loop"]["ok"] is False
    health.beat()
    assert get(app, "/healthz")[0].startswith("200")


def test_other_paths_are_the_metrics() -> None:
    registry = CollectorRegistry()
    Counter("streamrank_test_things", "things", registry=registry).inc()
    status, body = get(wsgi_app(registry, Health(())), "/metrics")
    assert status.startswith("200") and b"streamrank_test_things_total 1.0" in body


class Redis:
    def __init__(self, fail: BaseException | None) -> None:
        self.fail = fail

    async def ping(self) -> bool:
        if self.fail is not None:
            raise self.fail
        return True


async def test_watch_beats_and_pings() -> None:
    health = Health(("redis", "model"), stall_s=5)
    task = asyncio.create_task(
        watch(health, redis=Redis(None), checks={"model": lambda: (True, "v1")}, every_s=0.01)
    )
    await asyncio.sleep(0.05)
    task.cancel()
    ok, body = health.readiness()
    assert ok and body["checks"]["model"]["detail"] == "v1"
    await ping(health, Redis(ConnectionError("refused")), timeout_s=1)
    ok, body = health.readiness()
    assert not ok and "refused" in body["checks"]["redis"]["detail"]


class AnsweringRedis:
    """A Redis whose PING answers when the test says so."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def ping(self) -> bool:
        self.asked.set()
        await self.answer.wait()
        return True


async def test_watch_ends_when_cancelled_as_a_ping_answers() -> None:
    """A worker's stop cancels this task and waits for it: a cancellation that arrives in the
    same loop iteration as the PING's answer must still end it (``asyncio.wait_for`` on
    Python 3.11 returned the answer instead and the loop ran on: a scoring worker that could
    not reach Kafka hung in its stop instead of exiting)."""
    for turns in range(4):  # the cancel lands 0..3 loop iterations after the answer
        redis = AnsweringRedis()
        task = asyncio.create_task(watch(Health(("redis",)), redis=redis, every_s=0.01))
        async with asyncio.timeout(5):
            await redis.asked.wait()
        redis.answer.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done, f"watch ignored a cancellation {turns} iterations after the PING answered"
        assert task.cancelled()
