"""The soak's floor columns: per-window percentiles of the floor's run and ours minus it."""

from __future__ import annotations

from streamrank.settings import Settings
from workbench.bench.drive import Run
from workbench.bench.soak_floor import floor_settings, floor_summary, floor_window


def _run(latencies: list[tuple[int, float]]) -> Run:
    requests = [{"request_id": f"r{k}", "sent_ms": sent} for k, (sent, _) in enumerate(latencies)]
    replies = [
        {"request_id": f"r{k}", "latency_ms": lat, "degraded": False}
        for k, (_, lat) in enumerate(latencies)
    ]
    return Run([], requests, replies)


def test_floor_window_takes_the_requests_sent_in_the_window() -> None:
    run = _run([(100, 5.0), (200, 7.0), (900, 500.0), (1500, 9.0)])
    got = floor_window(run, 0, 1000)
    assert got["floor_p50_ms"] == 7.0
    assert 480.0 < got["floor_p99_ms"] <= 500.0  # the slow one counts, the one after does not
    assert floor_window(run, 2000, 3000) == {}  # nothing sent then: no columns


def test_floor_summary_subtracts_the_floor_window_by_window() -> None:
    per_minute = [
        {"p99_ms": 50.0, "floor_p99_ms": 20.0},
        {"p99_ms": 40.0, "floor_p99_ms": 25.0},
        {"p99_ms": 90.0},  # the floor's replies missing in a window: left out
        {"p99_ms": 70.0, "floor_p99_ms": 30.5},
    ]
    run = _run([(0, 1.0), (10, 2.0)])
    run.replies.pop()  # one request unanswered
    got = floor_summary(per_minute, run)
    assert got["p99_first_ms"] == 25.0 and got["p99_last_ms"] == 30.5  # after the warm-up window
    assert got["ours_minus_floor_p99_ms"] == [30.0, 15.0, 39.5]
    assert got["requests"] == 2 and got["unanswered"] == 1


def test_the_floor_has_topics_and_a_group_of_its_own() -> None:
    s = Settings()
    floor = floor_settings(s)
    assert floor.topics.requests == f"{s.topics.requests}-floor"
    assert floor.topics.results == f"{s.topics.results}-floor"
    assert floor.scoring.group_id != s.scoring.group_id
    assert floor.topics.clicks == s.topics.clicks
