import asyncio
import gc
import time

from prometheus_client import CollectorRegistry

from streamrank.runtime.group_metrics import GroupMetrics, Wording
from streamrank.runtime.loop_health import GcPauses, freeze_start_up_objects, watch_loop_lag

WORDING = Wording(items="Records", after="the batch", committed="records", topic="the topic")


async def test_a_blocking_call_on_the_loop_shows_as_its_lag() -> None:
    seen: list[float] = []
    watcher = asyncio.create_task(watch_loop_lag(seen.append, interval_s=0.01))
    await asyncio.sleep(0.05)
    time.sleep(0.2)  # noqa: ASYNC251 (the point: the loop is blocked, its timers fire late)
    await asyncio.sleep(0.05)
    watcher.cancel()
    assert max(seen) >= 0.15
    assert sorted(seen)[len(seen) // 2] < 0.05  # the other wake-ups came about on time


def test_gc_pauses_are_observed_by_generation_into_the_worker_metrics() -> None:
    registry = CollectorRegistry()
    metrics = GroupMetrics(registry, prefix="x", wording=WORDING)
    with GcPauses(metrics.gc_paused):
        gc.collect(2)
        gc.collect(0)
    gc.collect(2)  # removed: not observed
    count = registry.get_sample_value
    assert count("x_gc_pause_seconds_count", {"generation": "2"}) == 1
    assert count("x_gc_pause_seconds_count", {"generation": "0"}) == 1
    assert (count("x_gc_pause_seconds_sum", {"generation": "2"}) or 0) > 0
    assert registry.get_sample_value("x_event_loop_lag_seconds_count") == 0


def test_freezing_moves_the_live_objects_out_of_the_collector_scans() -> None:
    try:
        keep = [object() for _ in range(1000)]
        frozen = freeze_start_up_objects()
        assert frozen == gc.get_freeze_count() >= len(keep)
        assert not any(o is keep for o in gc.get_objects(generation=2))
    finally:
        gc.unfreeze()
