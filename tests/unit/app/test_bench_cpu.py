"""The CPU accounting of the benchmarks: host busy time and the Redis side per event."""

from __future__ import annotations

import os

import pytest

from workbench.bench.cpu import (
    RedisUsage,
    host_busy_seconds,
    parse_usage,
    process_cpu_seconds,
    redis_usage_per_event,
)

TICK = os.sysconf("SC_CLK_TCK")


def test_host_busy_leaves_out_idle_and_iowait() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat = "cpu  100 5 40 9000 300 2 3 0 7 0\ncpu0 50 2 20 4500 150 1 1 0 0 0\n"
    assert host_busy_seconds(stat) == pytest.approx((100 + 5 + 40 + 2 + 3 + 0) / TICK)


def test_host_and_process_clocks_move_forward() -> None:
    host0, own0 = host_busy_seconds(), process_cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))  # burn some CPU
    assert process_cpu_seconds(os.getpid()) > own0
    assert host_busy_seconds() >= host0 + (process_cpu_seconds(os.getpid()) - own0) * 0.5


def test_usage_is_summed_over_servers() -> None:
    cpu = [{"used_cpu_user": 1.5, "used_cpu_sys": 0.5}, {"used_cpu_user": 2.0, "used_cpu_sys": 1.0}]
    stats = [
        {"cmdstat_set": {"calls": 10, "usec": 30, "usec_per_call": 3.0}},
        {"cmdstat_set": {"calls": 5, "usec": 20, "usec_per_call": 4.0},
         "cmdstat_evalsha": {"calls": 1, "usec": 90, "usec_per_call": 90.0}},
    ]  # fmt: skip
    usage = parse_usage(cpu, stats)
    assert usage.cpu_s == pytest.approx(5.0)
    assert usage.commands == {"set": (15, 50), "evalsha": (1, 90)}


def test_per_event_figures_split_the_script_from_the_commands_it_ran() -> None:
    before = RedisUsage(cpu_s=10.0, commands={"set": (100, 1_000), "evalsha": (1, 5_000)})
    after = RedisUsage(
        cpu_s=10.5,
        commands={
            "set": (300, 3_000),  # +2,000 us inside the scripts
            "hincrby": (50, 1_000),  # new since `before`
            "evalsha": (3, 9_000),  # +4,000 us: the calls, commands included
            "info": (9, 900),  # the benchmark's own snapshots
            "client|setname": (2, 10),  # a connection's housekeeping (Redis 7 naming)
        },
    )
    out = redis_usage_per_event(before, after, 1_000)
    assert out["redis_cpu_us_per_event"] == 500.0
    assert out["redis_script_us_per_event"] == 4.0
    assert out["redis_commands_us_per_event"] == {"set": 2.0, "hincrby": 1.0}
    # 4,000 us of script time, 3,000 of it in the commands: the interpreter's is a quarter
    assert out["redis_script_interpreter_share"] == 0.25


def test_no_script_calls_means_no_interpreter_share() -> None:
    usage = RedisUsage(cpu_s=1.0, commands={"get": (1, 5)})
    assert redis_usage_per_event(usage, usage, 10)["redis_script_interpreter_share"] is None
