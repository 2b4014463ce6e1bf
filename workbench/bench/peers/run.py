"""Running a peer of ``bench streams`` (``--peer quix``) on the run's backlog: as a child
process in a consumer group of its own, with the Redis servers' CPU read around it."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

import orjson

from streamrank.redis.client import redis_client
from streamrank.settings import Settings
from workbench.bench.cpu import redis_usage, redis_usage_per_event

PEERS = {"quix": ("quixstreams", "workbench.bench.peers.quix_streams", "quixstreams==3.*")}


def require(peer: str) -> None:
    """Refuse, saying what to install, when the peer's library is missing."""
    module, _script, requirement = PEERS[peer]
    if importlib.util.find_spec(module) is None:
        raise RuntimeError(
            f"`bench streams --peer {peer}` runs the peer with {module}, which streamrank does "
            f"not depend on: pip install '{requirement}' into this environment, or leave out "
            "--peer"
        )


async def peer_drain(
    settings: Settings, run: str, peer: str, *, expected: int, work_dir: Path, raw_cpu_us: float
) -> dict[str, Any]:
    """The peer drains the backlog of ``settings.topics.clicks`` from the start: its events/s,
    its CPU per event (the whole process) and the Redis servers' per event."""
    from workbench.devstack.processes import start_child, worker_env

    require(peer)
    _module, script, requirement = PEERS[peer]
    out = work_dir / f"{run}-{peer}.json"
    redis = redis_client(settings.redis, timeout_s=10)
    try:
        before = await redis_usage(redis)
        child = start_child(
            [sys.executable, "-m", script, "--group", f"{run}-{peer}", "--events", str(expected),
             "--out", str(out)],
            what=f"{peer} peer", log_path=work_dir / f"{run}-{peer}.log", env=worker_env(settings),
        )  # fmt: skip
        code = await asyncio.to_thread(child.process.wait, 900)
        if code != 0 or not out.exists():
            raise RuntimeError(f"the {peer} peer exited {code}: {child.log_text()[-2000:]}")
        redis_side = redis_usage_per_event(before, await redis_usage(redis), expected)
    finally:
        await redis.aclose()
    result = orjson.loads(out.read_bytes())
    events_per_s = result["events"] / max(result["seconds"], 1e-9)
    cpu_us = result["cpu_seconds"] / max(result["events"], 1) * 1e6
    total_us = cpu_us + redis_side["redis_cpu_us_per_event"]
    return {
        "peer": requirement,
        "events_per_s": round(events_per_s, 1),
        "worker_cpu_us_per_event": round(cpu_us, 1),
        **redis_side,
        "cpu_vs_raw": round(total_us / max(raw_cpu_us, 1e-9), 2),
    }
