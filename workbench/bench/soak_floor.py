"""The broker's true floor beside the soak (``streamrank bench soak --floor``).

The minimal aiokafka echo (:mod:`workbench.bench.floor`) runs on request and reply topics and
a consumer group of its own, on the soak's broker and host, and a second load driver sends it
the soak's request rate (no clicks) for the same minutes. Per window its p50/p99 stand beside
ours: what the broker and the host alone take over the run, measured at the same time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamrank.kafka.topics import create_topics
from streamrank.settings import Settings
from workbench.bench.drive import Run
from workbench.bench.scoring_phases import FLOOR_CLI, phase_settings
from workbench.devstack.processes import ChildProcess, start_child, start_command, worker_env


def floor_settings(settings: Settings) -> Settings:
    """The soak's settings with the floor's own request and reply topics (a phase of its own)
    and group: it runs beside the soak's scoring worker, not after it."""
    floor = phase_settings(settings, "floor")
    return floor.with_env(STREAMRANK_SCORING_GROUP_ID=f"{settings.scoring.group_id}-floor")


async def start_floor(settings: Settings, run_dir: Path) -> tuple[Settings, ChildProcess]:
    """The floor's topics and process (started early: its group join takes seconds)."""
    floor = floor_settings(settings)
    await create_topics(floor, topics=(floor.topics.requests, floor.topics.results))
    child = start_child(
        FLOOR_CLI, what="true floor", log_path=run_dir / "floor.log", env=worker_env(floor)
    )
    return floor, child


def start_floor_driver(
    floor: Settings, run_dir: Path, *, seconds: float, request_rate: float, driver_args: list[str]
) -> ChildProcess:
    """The floor's load driver: requests only, at the soak's rate, records under ``floor-run``."""
    return start_command(
        ["bench", "drive", "--json", "--records", str(run_dir / "floor-run"),
         "--seconds", str(seconds), "--click-rate", "0", "--request-rate", str(request_rate),
         *driver_args],
        floor, log_path=run_dir / "floor-driver.log", what="floor load driver",
    )  # fmt: skip


def floor_window(run: Run, start_ms: int, end_ms: int) -> dict[str, Any]:
    """The floor's p50/p99 for the requests sent in one window (nothing when none came back)."""
    return {f"floor_{name}": value for name, value in run.percentiles_ms(start_ms, end_ms).items()}


def floor_summary(per_minute: list[dict[str, Any]], run: Run) -> dict[str, Any]:
    """The floor's p99 after the warm-up and in the last window, and ours minus it per window."""
    warm = per_minute[1] if len(per_minute) > 1 else per_minute[0]
    last = per_minute[-1]
    both = [m for m in per_minute if "p99_ms" in m and "floor_p99_ms" in m]
    return {
        "requests": len(run.requests),
        "unanswered": len(run.unanswered()),
        "p99_first_ms": warm.get("floor_p99_ms"),
        "p99_last_ms": last.get("floor_p99_ms"),
        "ours_minus_floor_p99_ms": [round(m["p99_ms"] - m["floor_p99_ms"], 2) for m in both],
    }
