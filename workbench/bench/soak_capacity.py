"""The combined capacity of ``bench soak``: clicks and requests offered together, in the soak's
proportions, at rising levels, until the workers no longer keep up.

Each path's maximum is measured with the other idle, and the two share the host's cores, so
the two maxima together are more than the host has. A level ``x`` offers ``x`` times each
maximum at once for ``probe_s`` (one ``bench drive`` process); it keeps up when, at the end of
its sends, neither group is more than :data:`LAG_SLACK_S` seconds (a tenth of a shorter probe)
of its offered rate behind,
every request is answered within the drain, at most :data:`DEGRADED_SLACK` of the replies
are degraded (an overloaded worker answers "expired" quickly: answered, but not served) and the
p99 send-to-reply latency, past the probe's first :data:`WARMUP_SHARE`, is within the ranking
budget (``--p99-budget-ms``, the cascade's default deadline): a worker that keeps up only
by queueing seconds of requests is not serving them. The combined capacity is the highest level
that keeps up; the soak runs at a fraction of it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamrank.settings import Settings
from workbench.bench.drive import Run, load_run
from workbench.devstack.processes import start_command

logger = logging.getLogger(__name__)

# shares of each path's own maximum
LEVELS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
LAG_SLACK_S = 3.0  # seconds of offered load a group may be behind and still keep up
DEGRADED_SLACK = 0.01  # share of a probe's replies that may be degraded (e.g. expired)
WARMUP_SHARE = 0.2  # first share of a probe's sends left out of its p99 (clients connecting)
Lags = Callable[[Settings], Awaitable[dict[str, int]]]


@dataclass(frozen=True, slots=True)
class Probe:
    """Where the probes run: settings, the driver's item file and the records' folder."""

    settings: Settings
    items_file: Path
    run_dir: Path
    users: int
    candidates: int
    seconds: float
    p99_budget_ms: float


def served(*, replies: int, degraded: int) -> bool:
    """At most :data:`DEGRADED_SLACK` of the replies degraded."""
    return degraded <= DEGRADED_SLACK * replies


def within_budget(p99_ms: float | None, *, budget_ms: float) -> bool:
    """The probe's p99 (``None`` when no request was answered) at most ``budget_ms``."""
    return p99_ms is not None and p99_ms <= budget_ms


def p99_after_warmup(run: Run, *, seconds: float) -> float | None:
    """p99 send-to-reply latency of the requests sent after the first :data:`WARMUP_SHARE` of
    the probe; ``None`` when none of them was answered."""
    if not run.requests:
        return None
    since_ms = min(r["sent_ms"] for r in run.requests) + int(WARMUP_SHARE * seconds * 1000)
    latencies = run.latencies_ms(since_ms)
    return round(float(np.percentile(latencies, 99)), 2) if latencies.size else None


def keeps_up(
    lag: dict[str, int], *, click_rate: float, request_rate: float, probe_s: float
) -> bool:
    """Neither group more than :data:`LAG_SLACK_S` seconds (a tenth of a shorter probe) of its
    offered rate behind."""
    slack_s = min(LAG_SLACK_S, probe_s / 10)
    return lag["features"] <= max(100.0, click_rate * slack_s) and lag["scoring"] <= max(
        20.0, request_rate * slack_s
    )


async def probe_level(
    probe: Probe, lags: Lags, *, level: float, click_rate: float, request_rate: float
) -> dict[str, Any]:
    """One level offered for ``probe.seconds``: the lag when its sends end, its replies."""
    out = probe.run_dir / f"capacity-{level:.2f}"
    driver = start_command(
        ["bench", "drive", "--json", "--records", str(out), "--seconds", str(probe.seconds),
         "--click-rate", str(click_rate), "--request-rate", str(request_rate),
         "--users", str(probe.users), "--candidates", str(probe.candidates),
         "--item-file", str(probe.items_file), "--drain-s", "60"],
        probe.settings, log_path=probe.run_dir / "capacity-driver.log", what="load driver",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (out / "progress.json").exists():  # written once the sends begin
            if not driver.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the load driver did not start: {driver.log_text()[-2000:]}")
            await asyncio.sleep(0.2)
        await asyncio.sleep(probe.seconds)
        lag = await lags(probe.settings)
        await asyncio.to_thread(driver.process.wait)
    finally:
        driver.stop(timeout_s=20)
    run = load_run(out)
    latencies = run.latencies_ms()
    p99_ms = p99_after_warmup(run, seconds=probe.seconds)
    unanswered = len(run.unanswered())
    replies = run.first_replies()
    degraded = sum(1 for reply in replies.values() if reply["degraded"])
    return {
        "level": level,
        "click_rate": click_rate,
        "request_rate": request_rate,
        "lag_at_end_of_sends": lag,
        "unanswered": unanswered,
        "degraded": degraded,
        "p50_ms": round(float(np.percentile(latencies, 50)), 2) if latencies.size else None,
        "p99_ms": p99_ms,
        "keeps_up": unanswered == 0
        and served(replies=len(replies), degraded=degraded)
        and within_budget(p99_ms, budget_ms=probe.p99_budget_ms)
        and keeps_up(lag, click_rate=click_rate, request_rate=request_rate, probe_s=probe.seconds),
    }


async def combined_capacity(
    probe: Probe, lags: Lags, *, max_clicks: float, max_requests: float
) -> dict[str, Any]:
    """Levels of :data:`LEVELS` in turn until one does not keep up; the highest that did
    (0 when none did) with its rates, and every probe's figures."""
    probes: list[dict[str, Any]] = []
    best = 0.0
    for level in LEVELS:
        click_rate, request_rate = round(level * max_clicks, 1), round(level * max_requests, 1)
        logger.info("capacity probe: %.0f%% of each maximum (%.0f clicks/s, %.0f requests/s)",
                    100 * level, click_rate, request_rate)  # fmt: skip
        result = await probe_level(
            probe, lags, level=level, click_rate=click_rate, request_rate=request_rate
        )
        probes.append(result)
        await drained(probe.settings, lags)
        if not result["keeps_up"]:
            break
        best = level
    return {
        "level": best,
        "clicks_per_s": round(best * max_clicks, 1),
        "requests_per_s": round(best * max_requests, 1),
        "p99_budget_ms": probe.p99_budget_ms,
        "probes": probes,
    }


async def drained(settings: Settings, lags: Lags, *, timeout_s: float = 180.0) -> None:
    """Until both groups are back to no lag (a probe that did not keep up left a backlog)."""
    deadline = time.monotonic() + timeout_s
    while any((await lags(settings)).values()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers were still behind {timeout_s:.0f} s after a probe")
        await asyncio.sleep(1.0)
