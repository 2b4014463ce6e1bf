"""``bench streams --ab-script``'s goal ratios, and ``--peer`` without its library."""

from __future__ import annotations

import pytest

from workbench.bench.peers import run as peers
from workbench.bench.streams_drain import ab_ratios


def test_the_goal_ratios_compare_the_arms_and_the_raw_consumer() -> None:
    previous = {"redis_cpu_us_per_event": 30.0, "worker_cpu_us_per_event": 40.0, "events_per_s": 20_000.0}  # fmt: skip
    current = {"redis_cpu_us_per_event": 12.0, "worker_cpu_us_per_event": 20.0, "events_per_s": 32_000.0}  # fmt: skip
    got = ab_ratios(previous, current, raw_cpu_us=11.0)
    assert got["redis_cpu_current_vs_previous"] == 0.4 and got["goal_redis_cpu_half"]
    assert got["cpu_current_vs_raw"] == 2.91 and got["goal_cpu_3x_raw"]
    assert got["cpu_previous_vs_raw"] == 6.36
    assert got["events_per_s_current_vs_previous"] == 1.6 and got["goal_events_per_s_1_5x"]
    slower = ab_ratios(previous, {**current, "events_per_s": 25_000.0}, raw_cpu_us=10.0)
    assert not slower["goal_events_per_s_1_5x"] and not slower["goal_cpu_3x_raw"]


def test_a_missing_peer_library_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(peers.PEERS, "quix", ("no_such_module_x", "x", "quixstreams==3.*"))
    with pytest.raises(RuntimeError, match=r"pip install 'quixstreams==3\.\*'"):
        peers.require("quix")
