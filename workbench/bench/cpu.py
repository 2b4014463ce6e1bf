"""Where a benchmark's CPU went: our processes, the Redis servers, the whole host.

A worker's own CPU per event does not say whether the host had a core to spare: on a small
host the Redis servers running our scripts and the broker share the cores with it. So the
benchmarks also read

- each Redis server's CPU (``INFO cpu``) and its time per command (``INFO commandstats``, which
  counts the commands a script runs as well as the script call itself), summed over a
  cluster's masters;
- the host's busy cores (``/proc/stat``: every state but idle and iowait).

Snapshots are taken before and after a phase; :func:`redis_usage_per_event` turns two of them
into figures per event.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrank.redis.client import on_each_server

# Commands the benchmark itself or a client's connection sends: not part of the work measured.
_HOUSEKEEPING = frozenset({"info", "ping", "client", "hello", "select", "script", "config"})
_SCRIPT_CALLS = frozenset({"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"})


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_busy_seconds(stat: str | None = None) -> float:
    """CPU seconds the host's cores have been busy since boot (``/proc/stat``'s first line, all
    states but idle and iowait; guest time is already counted in user)."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    fields = [int(v) for v in text.splitlines()[0].split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice]
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class RedisUsage:
    """One snapshot of the Redis servers' CPU: seconds, and ``command -> (calls, usec)``."""

    cpu_s: float
    commands: dict[str, tuple[int, int]]


def parse_usage(cpu_infos: list[dict[str, Any]], stat_infos: list[dict[str, Any]]) -> RedisUsage:
    """A snapshot from each server's parsed ``INFO cpu`` and ``INFO commandstats`` replies."""
    cpu = sum(float(i["used_cpu_user"]) + float(i["used_cpu_sys"]) for i in cpu_infos)
    commands: dict[str, tuple[int, int]] = {}
    for info in stat_infos:
        for key, value in info.items():
            if not key.startswith("cmdstat_"):
                continue
            name = key.removeprefix("cmdstat_")
            calls, usec = commands.get(name, (0, 0))
            commands[name] = (calls + int(value["calls"]), usec + int(value["usec"]))
    return RedisUsage(cpu_s=cpu, commands=commands)


async def redis_usage(client: Any) -> RedisUsage:
    """The Redis servers' CPU so far (every master of a cluster, or the one server)."""
    cpu = await on_each_server(client, "INFO", "cpu")
    stats = await on_each_server(client, "INFO", "commandstats")
    return parse_usage(cpu, stats)


def redis_usage_per_event(before: RedisUsage, after: RedisUsage, events: float) -> dict[str, Any]:
    """The Redis side of a phase, per event: the servers' CPU, the script calls' time, the time
    of the commands inside them (by command), and the script's own share (the Lua interpreter:
    the script's time less the commands it called)."""
    n = max(events, 1.0)
    script_us = 0
    inside: dict[str, float] = {}
    for name, (calls, usec) in after.commands.items():
        usec -= before.commands.get(name, (0, 0))[1]
        calls -= before.commands.get(name, (0, 0))[0]
        command = name.split("|", 1)[0]  # Redis 7 names subcommands "client|setname"
        if usec <= 0 or calls <= 0 or command in _HOUSEKEEPING:
            continue
        if command in _SCRIPT_CALLS:
            script_us += usec
        else:
            inside[name] = usec
    commands_us = sum(inside.values())
    return {
        "redis_cpu_us_per_event": round((after.cpu_s - before.cpu_s) * 1e6 / n, 1),
        "redis_script_us_per_event": round(script_us / n, 1),
        "redis_commands_us_per_event": {
            name: round(usec / n, 2) for name, usec in sorted(inside.items(), key=lambda kv: -kv[1])
        },
        "redis_script_interpreter_share": (
            round(max(0.0, script_us - commands_us) / script_us, 3) if script_us else None
        ),
    }
