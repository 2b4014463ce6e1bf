"""The hot-item pool's snapshot logic (a scripted reader and a fake clock): empty until the first
refresh, swapped on success, kept on failure (counted, logged at most every log_every_s), never
read at size 0, refreshed in the background until stopped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from scoring.serving.hotpool import HotPool
from scoring.serving.metrics import ScoringMetrics
from streamrank.errors import RedisUnavailable


class Clock:
    def __init__(self, now_ms: int = 1_800_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


class Reader:
    """Answers from ``answers`` in turn; an exception in the list is raised."""

    def __init__(self, *answers: Sequence[tuple[str, int]] | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, int, int]] = []

    async def hot_items(self, window: str, *, as_of_ms: int, n: int) -> Sequence[tuple[str, int]]:
        self.calls.append((window, as_of_ms, n))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def metric(metrics: ScoringMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


async def test_snapshot_empty_then_swapped_then_kept_while_reads_fail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    metrics = ScoringMetrics(CollectorRegistry())
    down = RedisUnavailable("Redis at redis://x:1 does not answer")
    reader = Reader([("b", 9), ("a", 4)], down, down, down, down, [("c", 2)])
    pool = HotPool(reader=reader, window="24h", size=2, refresh_s=5.0, clock=clock,
                   metrics=metrics, log_every_s=10.0)  # fmt: skip
    assert pool.items() == () and pool.as_of_ms is None
    clock.now_ms += 3_000
    assert metric(metrics, "streamrank_hot_pool_age_seconds") == 3.0  # none yet: since made
    assert await pool.refresh()
    assert reader.calls == [("24h", clock.now_ms, 2)]
    assert pool.items() == ("b", "a") and pool.as_of_ms == clock.now_ms
    assert metric(metrics, "streamrank_hot_pool_items") == 2
    caplog.set_level(logging.INFO, logger="scoring.serving.hotpool")
    for _ in range(4):  # Redis down: the snapshot stays; one warning per log_every_s
        clock.now_ms += 4_000
        assert not await pool.refresh()
        assert pool.items() == ("b", "a")
    assert pool.failures == 4
    assert metric(metrics, "streamrank_hot_pool_refresh_failures_total") == 4
    assert metric(metrics, "streamrank_hot_pool_age_seconds") == 16.0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # at +4 s and +16 s, not at +8 s or +12 s
    assert "serving the last snapshot (2 items, 4 s old)" in warnings[0].getMessage()
    assert "does not answer" in warnings[0].getMessage() and warnings[0].exc_info is None
    clock.now_ms += 1_000
    assert await pool.refresh()
    assert pool.items() == ("c",) and pool.failures == 0
    assert metric(metrics, "streamrank_hot_pool_age_seconds") == 0.0
    assert "refreshed again after 4 failed refreshes" in caplog.records[-1].getMessage()


async def test_an_unexpected_error_is_logged_with_its_traceback_and_the_pool_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = Reader(ValueError("a bucket holds a value that is not an integer"), [("a", 1)])
    pool = HotPool(reader=reader, window="1h", size=5, refresh_s=5.0, clock=Clock())
    assert not await pool.refresh()
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None and "not an integer" in record.getMessage()
    assert await pool.refresh() and pool.items() == ("a",)


async def test_a_pool_of_size_zero_never_reads() -> None:
    reader = Reader([("a", 1)])
    pool = HotPool(reader=reader, window="24h", size=0, refresh_s=0.01, clock=Clock())
    assert not await pool.refresh()
    pool.start()
    await asyncio.sleep(0.05)
    await pool.stop()
    assert reader.calls == [] and pool.items() == ()


async def test_background_refresh_runs_every_period_until_stopped() -> None:
    clock = Clock()
    reader = Reader([("a", 1)], RedisUnavailable("down"), [("b", 2)])
    pool = HotPool(reader=reader, window="24h", size=3, refresh_s=0.02, clock=clock)
    pool.start()
    assert pool.running
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(reader.calls) >= 3:
            break
    await pool.stop()
    assert not pool.running
    assert pool.items() == ("b",)  # read, failed (kept "a"), read again
    calls = len(reader.calls)
    await asyncio.sleep(0.05)
    assert len(reader.calls) == calls  # stopped
    await pool.stop()  # twice is fine
