"""Fault 1: a scoring worker killed (SIGKILL) or stopped (SIGTERM) under load, two in the
group; and the failover scenario of the issue (kill one of two at 60 req/s, then pause Redis
5 s) with its degraded share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from streamrank.settings import ScoringSettings, Settings
from tests.integration.support.reliability import (
    assert_alive,
    assert_all_answered,
    assert_degraded_only_within,
    now_ms,
    report,
    rig,
)

pytestmark = pytest.mark.timeout(420)


def revocations(log: str) -> int:
    return log.count("partitions revoked")


async def test_sigkill_one_of_two_the_survivor_takes_over(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    with rig(make_settings, unique, tmp_path, tiny_artifacts[0]) as r:
        await r.prepare()
        first, second = r.worker("scoring", "s1"), r.worker("scoring", "s2")
        r.drive(seconds=25, request_rate=60)
        await r.wait_flowing(replies=300)
        killed_at = now_ms()
        first.kill()
        run = await r.finish()
        assert_alive(second)
    assert_all_answered(run)
    # Requests that waited for the failover past their deadline are answered "expired".
    assert_degraded_only_within(run, [(killed_at - 3000, killed_at + 30_000)], reasons={"expired"})
    report("scoring worker SIGKILL (1 of 2)", run, start_ms=killed_at, end_ms=killed_at)


async def test_sigterm_one_of_two_gives_no_duplicate_reply(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    """A graceful stop finishes its batches, commits and leaves the group; the survivor's
    rebalance listener commits what it answered before its partitions are reassigned. (A
    budget longer than the rebalance, so no request expires meanwhile.)"""
    with rig(
        make_settings, unique, tmp_path, tiny_artifacts[0], STREAMRANK_SCORING_BUDGET_MS=10_000
    ) as r:
        await r.prepare()
        first, second = r.worker("scoring", "s1"), r.worker("scoring", "s2")
        r.drive(seconds=25, request_rate=60)
        await r.wait_flowing(replies=300)
        stopped_at = now_ms()
        assert first.stop(timeout_s=30) == 0, first.log_text()[-3000:]
        run = await r.finish()
        assert_alive(second)
        assert revocations(second.log_text()) >= 1  # the survivor really was rebalanced
    assert_all_answered(run)
    assert run.duplicates() == 0, f"{run.duplicates()} duplicate replies"
    assert not run.degraded(), run.reasons()
    report("scoring worker SIGTERM (1 of 2)", run, start_ms=stopped_at, end_ms=stopped_at)


# (session timeout ms, heartbeat ms, request budget ms, the most degraded share asserted)
SCENARIOS = {
    # The run: default settings. Every request that arrives during a Redis pause longer
    # than its 50 ms budget is degraded (13% of the run), and so is every request the dead
    # worker's partitions hold past its budget: reported, not asserted.
    "defaults": (6000, 1000, 50, None),
    # Callers that wait up to 3 s, on a broker that accepts a 3 s session (Tansu; Kafka with
    # group.min.session.timeout.ms <= 3000): a pause costs latency up to the budget, the
    # failover ~5 s instead of ~10 s.
    "tuned": (3000, 500, 3000, 0.15),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_failover_scenario_degraded_share(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path], name: str,
) -> None:  # fmt: skip
    """The issue's scenario: two workers at 60 req/s, one SIGKILLed, then Redis paused for 5 s
    (CLIENT PAUSE). Every request is answered; no rebalance under steady load before the kill
    (no false failover); the degraded share is printed (docs/reliability.md) and bounded for
    the tuned settings."""
    session, heartbeat, budget, most = SCENARIOS[name]
    with rig(make_settings, unique, tmp_path, tiny_artifacts[0], STREAMRANK_SCORING_BUDGET_MS=budget,
             STREAMRANK_KAFKA_SESSION_TIMEOUT_MS=session, STREAMRANK_KAFKA_HEARTBEAT_INTERVAL_MS=heartbeat,
             STREAMRANK_BREAKER_COOLDOWN_S=ScoringSettings.model_fields["breaker_cooldown_s"].default) as r:  # fmt: skip
        await r.prepare()
        first, second = r.worker("scoring", "s1"), r.worker("scoring", "s2")
        r.drive(seconds=38, request_rate=60, users=200)
        await r.wait_flowing(replies=60)
        steady = (revocations(first.log_text()), revocations(second.log_text()))
        await asyncio.sleep(6)
        # No false failover under load: nobody was rebalanced while all were alive.
        assert (revocations(first.log_text()), revocations(second.log_text())) == steady
        killed_at = now_ms()
        first.kill()
        await asyncio.sleep(14)
        paused_at = now_ms()
        client = r.redis.client()
        client.execute_command("CLIENT", "PAUSE", 5000)
        client.close()
        run = await r.finish()
        assert_alive(second)
    assert_all_answered(run)
    share = len(run.degraded()) / len(run.requests)
    by_fault = {"kill": 0, "pause": 0, "other": 0}
    for request, _reply in run.degraded():
        sent = request["sent_ms"]
        fault = (
            "pause"
            if sent >= paused_at - budget
            else "kill"
            if sent >= killed_at - budget
            else "other"
        )
        by_fault[fault] += 1
    report(
        f"failover scenario, {name} (session {session} ms, heartbeat {heartbeat} ms, "
        f"budget {budget} ms)",
        run,
        start_ms=killed_at,
        end_ms=paused_at + 5000,
        degraded_share=round(share, 3),
        degraded_by_fault=by_fault,
    )
    if most is not None:
        assert share <= most
