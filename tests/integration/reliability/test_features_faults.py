"""Fault 4: the features worker SIGKILLed mid-batch under load, then restarted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from streamrank.settings import Settings
from tests.integration.support.reliability import (
    assert_alive,
    assert_clicks_applied_once,
    now_ms,
    report,
    rig,
)

pytestmark = pytest.mark.timeout(420)


async def test_features_worker_killed_mid_batch_and_restarted(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    """Killed twice while it applies a steady 300 clicks/s (batches of up to 200 in flight),
    restarted each time: every click is applied once, none lost (what was written but not
    committed is redelivered and found already applied by its seen-marker)."""
    with rig(
        make_settings, unique, tmp_path, tiny_artifacts[0], STREAMRANK_FEATURES_BATCH_SIZE=200
    ) as r:
        await r.prepare()
        worker = r.worker("features", "features-1")
        r.drive(seconds=25, click_rate=300, users=60)
        kills = []
        for restart in (2, 3):
            await asyncio.sleep(6)
            assert worker.alive(), worker.log_text()[-3000:]
            kills.append(now_ms())
            worker.kill()
            worker = r.worker("features", f"features-{restart}")
        run = await r.finish()
        await assert_clicks_applied_once(r.settings, run, timeout_s=120)
        assert_alive(worker)
    report(
        "features worker SIGKILL mid-batch (twice), restarted",
        run,
        start_ms=kills[0],
        end_ms=kills[-1],
    )
