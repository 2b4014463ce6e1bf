"""The slowest requests' trace of ``bench scoring``: stage means of the tail beside all."""

from __future__ import annotations

from workbench.bench.loadgen import RunStats


def stats_of(rows: list[tuple[float, dict[str, float]]]) -> RunStats:
    """Requests sent at 0 and answered ``round_trip`` ms later, with their ``timings_ms``."""
    stats = RunStats()
    for n, (round_trip_ms, timings) in enumerate(rows):
        rid = f"r{n}"
        stats.sent[rid] = 0.0
        stats.got[rid] = round_trip_ms / 1000
        stats.timings[rid] = timings
    return stats


def test_the_slowest_percent_shows_the_stage_that_made_it_slow() -> None:
    fast = [(10.0, {"queue_wait": 2.0, "forward": 3.0, "total": 6.0})] * 198
    slow = [(90.0, {"queue_wait": 70.0, "forward": 3.0, "total": 74.0})] * 2
    trace = stats_of(fast + slow).tail_trace(slowest=0.01)

    assert trace["slowest_requests"] == 2
    assert trace["slowest"] == {
        "queue_wait_ms": 70.0,
        "forward_ms": 3.0,
        "total_ms": 74.0,
        "round_trip_ms": 90.0,
        "reply_path_ms": 16.0,
    }
    assert trace["all"]["queue_wait_ms"] == 2.68  # (198 * 2 + 2 * 70) / 200
    assert trace["all"]["reply_path_ms"] == 4.12  # (198 * 4 + 2 * 16) / 200


def test_a_stage_only_some_replies_carry_is_averaged_over_those() -> None:
    rows = [
        (20.0, {"total": 10.0, "retrieval": 4.0}),
        (10.0, {"total": 5.0}),
    ]
    trace = stats_of(rows).tail_trace(slowest=1.0)

    assert trace["all"]["retrieval_ms"] == 4.0
    assert trace["all"]["reply_path_ms"] == 7.5


def test_replies_without_timings_give_no_trace() -> None:
    stats = RunStats()
    stats.sent["r"] = 0.0
    stats.got["r"] = 0.01
    assert stats.tail_trace() == {}
