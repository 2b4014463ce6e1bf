"""What ``/healthz`` and ``/readyz`` answer (served beside ``/metrics`` by
:mod:`streamrank.runtime.metrics_http`).

- ``/healthz`` (liveness): the process is alive and its event loop responsive: the loop beats
  (:func:`watch`) and the HTTP thread checks the last beat is recent. A wedged loop (a blocking
  call, a deadlock) fails it, so Kubernetes restarts the container.
- ``/readyz`` (readiness): every named check passes: the worker joined its consumer group,
  Redis answers, and (scoring) a model is loaded. A worker that is not ready still runs; it is
  only taken out of the ready count (and of a PodDisruptionBudget's budget).

The worker's event loop writes the state; the HTTP server's thread only reads it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from streamrank.redis.errors import TRANSIENT

logger = logging.getLogger(__name__)

_NO_ANSWER: tuple[type[BaseException], ...] = (TimeoutError, *TRANSIENT)

STALL_S = 15.0  # no beat for this long: the event loop is not responsive


class Health:
    """Liveness beats and readiness checks of one worker process."""

    def __init__(self, checks: Iterable[str], *, stall_s: float = STALL_S) -> None:
        self._lock = threading.Lock()
        self._stall_s = stall_s
        self._beat = time.monotonic()
        self._started = time.monotonic()
        self._checks: dict[str, tuple[bool, str]] = {name: (False, "not yet") for name in checks}

    def beat(self) -> None:
        self._beat = time.monotonic()

    def set(self, check: str, ok: bool, detail: str = "") -> None:
        with self._lock:
            before = self._checks.get(check)
            if before is None or before[0] != ok:
                logger.info("readiness %s: %s (%s)", check, "ok" if ok else "failing", detail)
            self._checks[check] = (ok, detail)

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        since = time.monotonic() - self._beat
        ok = since < self._stall_s
        return ok, {
            "status": "ok" if ok else "stalled",
            "event_loop_last_beat_s": round(since, 3),
            "stall_after_s": self._stall_s,
            "uptime_s": round(time.monotonic() - self._started, 1),
        }

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        live, _ = self.liveness()
        with self._lock:
            checks = dict(self._checks)
        ok = live and all(passed for passed, _ in checks.values())
        body = {name: {"ok": passed, "detail": detail} for name, (passed, detail) in checks.items()}
        if not live:
            body["event_loop"] = {"ok": False, "detail": "stalled"}
        return ok, {"status": "ready" if ok else "not ready", "checks": body}


Check = Callable[[], tuple[bool, str]]


async def watch(
    health: Health,
    *,
    redis: Any | None = None,
    checks: Mapping[str, Check] | None = None,
    every_s: float = 1.0,
) -> None:
    """Beat every ``every_s`` on the worker's loop, PING ``redis`` (check ``redis``) and
    evaluate ``checks`` (name -> ``(ok, detail)``); runs until cancelled."""
    while True:
        health.beat()
        for name, check in (checks or {}).items():
            health.set(name, *check())
        if redis is not None:
            await ping(health, redis, timeout_s=max(0.5, every_s))
        await asyncio.sleep(every_s)


async def ping(health: Health, redis: Any, *, timeout_s: float) -> None:
    """One Redis PING into the ``redis`` check."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):  # not wait_for: see streamrank.runtime.tasks
            await redis.ping()
    except _NO_ANSWER as exc:
        health.set("redis", False, f"no answer: {exc!r}")
    except Exception as exc:  # e.g. an auth error: not ready, and say why
        health.set("redis", False, f"{type(exc).__name__}: {exc}")
    else:
        health.set("redis", True, f"PING {1000 * (time.perf_counter() - started):.1f} ms")
