"""Faults 2 and 3: Redis killed and restarted under load (both workers), and Redis paused for
longer than the request budget."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from streamrank.settings import Settings
from tests.integration.support.reliability import (
    assert_alive,
    assert_all_answered,
    assert_clicks_applied_once,
    assert_degraded_only_within,
    now_ms,
    report,
    rig,
)

pytestmark = pytest.mark.timeout(420)


async def test_redis_killed_and_restarted_under_load(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    """SIGKILL (append-only file, fsync always), 4 s down, restarted with its data: scoring
    answers degraded while it is down and normal again without a restart; the features worker
    loses nothing and counts nothing twice."""
    with rig(make_settings, unique, tmp_path, tiny_artifacts[0]) as r:
        await r.prepare()
        features, scoring = r.worker("features", "features"), r.worker("scoring", "scoring")
        r.drive(seconds=30, click_rate=80, request_rate=40)
        await r.wait_flowing(replies=200)
        down_at = now_ms()
        r.redis.kill()
        await asyncio.sleep(4)
        r.redis.start()
        up_at = now_ms()
        run = await r.finish()
        await assert_clicks_applied_once(r.settings, run)
        assert_alive(features, scoring)
    assert_all_answered(run)
    # Degraded only for requests sent while Redis was down (and until the breaker's next probe).
    window = (down_at - r.settings.scoring.budget_ms, up_at + 5000)
    assert_degraded_only_within(run, [window], reasons={"redis_unavailable", "breaker_open"})
    assert run.degraded(), "Redis was down for 4 s: some replies must be degraded"
    report("Redis killed (SIGKILL, 4 s down, restarted)", run, start_ms=down_at, end_ms=up_at)


async def test_redis_paused_longer_than_the_budget(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    """CLIENT PAUSE 3 s with a 400 ms request budget: the requests that cannot be served in time
    are answered degraded at their deadline (not after the pause), none is missing."""
    budget = 400
    with rig(
        make_settings, unique, tmp_path, tiny_artifacts[0], STREAMRANK_SCORING_BUDGET_MS=budget
    ) as r:
        await r.prepare()
        scoring = r.worker("scoring", "scoring")
        r.drive(seconds=20, request_rate=60)
        await r.wait_flowing(replies=200)
        paused_at = now_ms()
        client = r.redis.client()
        client.execute_command("CLIENT", "PAUSE", 3000)
        client.close()
        run = await r.finish()
        assert_alive(scoring)
    assert_all_answered(run)
    assert_degraded_only_within(
        run, [(paused_at - budget, paused_at + 3000)], reasons={"redis_unavailable", "expired"}
    )
    degraded = run.degraded()
    assert len(degraded) >= 60, "a 3 s pause at 60 req/s with a 400 ms budget degrades ~2.6 s"
    late = np.array([reply["served_at"] - (request["sent_ms"] + budget)
                     for request, reply in degraded])  # fmt: skip
    # Answered at the deadline, not when the pause ended (up to 3 s later): a loaded machine
    # may add some scheduling delay.
    assert late.max() < 500, f"degraded replies served up to {late.max()} ms after the deadline"
    report(
        f"Redis paused (CLIENT PAUSE 3 s, budget {budget} ms)",
        run,
        start_ms=paused_at,
        end_ms=paused_at + 3000,
        served_after_deadline_max_ms=round(float(late.max())),
    )
