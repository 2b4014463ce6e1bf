"""The rollout driver and the people's controls on the real Redis, with online statistics made
by the real join: one driver acts at a time (the lease), a driver taking over continues from
Redis, pause/resume/abort from the CLI, a split changed behind the rollout's back pauses it,
and a failing guard rolls back at once. Time is the driver's injected clock, far from now, so
no other test's statistics share its buckets."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from schemas import ClickEvent
from scoring.model.canary import assign, parse_split
from scoring.rollout.driver import RolloutDriver, start_rollout
from scoring.rollout.join import JoinConfig, OutcomeStore, assemble
from scoring.rollout.records import Served
from scoring.rollout.state import RolloutStore
from streamrank import clock, keys
from tests.conftest import StackInfo
from tests.integration.support.scoring import publish
from workbench.cli.main import main

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.standalone_only(
        "online outcomes and rollouts need a standalone or Sentinel Redis (their join script is not cluster-safe yet)"
    ),
]
CONFIG = JoinConfig(window_ms=60_000, close_delay_ms=0, bucket_s=1, seen_ttl_ms=600_000,
                    stats_ttl_ms=600_000)  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = clock.now_ms() + 30 * 86_400_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
async def pointers(redis: aioredis.Redis) -> AsyncIterator[None]:
    """Serving pointers and rollout keys as they were before the test."""
    saved = await redis.mget([keys.active_model(), keys.model_split()])
    yield
    await redis.delete(keys.rollout_state(), keys.rollout_history(), keys.rollout_lease())
    for key, value in zip((keys.active_model(), keys.model_split()), saved, strict=True):
        if value is None:
            await redis.delete(key)
        else:
            await redis.set(key, value)


async def traffic(
    redis: aioredis.Redis, split_text: str, *, good: set[str], n: int, at: int, tag: str
) -> None:
    """``n`` requests of 10 items routed by the split; the user clicks item 0, which a good
    version ranks first and a bad one (not in ``good``) anywhere."""
    rng = random.Random(tag)
    users = [f"{tag}-u{k}" for k in range(n)]
    served, clicks = [], []
    for k, (user, version) in enumerate(zip(users, assign(users, parse_split(split_text)),
                                            strict=True)):  # fmt: skip
        scores = [rng.random() * 0.5 for _ in range(10)]
        scores[0] = 0.9 if version in good else rng.random()
        items = tuple(f"i{j}" for j in range(10))
        served.append(
            Served(f"{tag}-r{k}", user, version, items, tuple(scores), at, latency_ms=5.0)
        )
        clicks.append(ClickEvent(event_id=f"{tag}-c{k}", user_id=user, item_id="i0", ts=at + 10))
    await OutcomeStore(redis=redis).apply(assemble(served, clicks, config=CONFIG, now_ms=at + 10))


async def run_main(argv: list[str]) -> int:
    """The CLI in a thread (it runs its own event loop), as from a shell."""
    return await asyncio.to_thread(main, argv)


async def cli(*args: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert await run_main(["rollout", *args]) == 0
    return capsys.readouterr().out


async def test_lease_takeover_controls_external_split_and_rollback(
    redis: aioredis.Redis, tiny_artifacts: tuple[Path, Path], pointers: None, stack: StackInfo,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], unique: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("STREAMRANK_REDIS_URL", stack.redis_url)
    monkeypatch.setenv("STREAMRANK_OUTCOME_BUCKET_S", "1")
    va, vb = await publish(redis, tiny_artifacts[0]), await publish(redis, tiny_artifacts[1])
    await redis.delete(keys.model_split(), keys.rollout_state(), keys.rollout_lease())
    await redis.set(keys.active_model(), va)
    now = Clock()
    state = await start_rollout(redis, new=vb, steps="20,50,100", hold_s=1.0, min_outcomes=30,
                                guard="auc:0.01,degraded:5%", by="test", now_ms=now())  # fmt: skip
    assert await redis.get(keys.model_split()) == f"{va}:0.8,{vb}:0.2".encode()
    first = RolloutDriver(redis=redis, bucket_s=1, owner="first", lease_s=60, clock_ms=now)
    second = RolloutDriver(redis=redis, bucket_s=1, owner="second", lease_s=60, clock_ms=now)
    tick = await first.tick()
    assert tick.lease and tick.decision is not None and tick.decision.action == "hold"
    assert "of 30 outcomes" in tick.decision.reason
    assert not (await second.tick()).lease  # one driver acts at a time

    await traffic(redis, state.split_text(), good={va, vb}, n=400, at=now() + 100, tag=f"a{unique}")
    now.now += 500  # not held long enough yet
    assert (await first.tick()).decision.action == "hold"  # type: ignore[union-attr]
    now.now += 1000
    tick = await first.tick()
    assert tick.acted and tick.state is not None and tick.state.step == 1
    assert await redis.get(keys.model_split()) == f"{va}:0.5,{vb}:0.5".encode()

    # people: pause (the driver holds), status, resume
    assert "paused" in await cli("pause", capsys=capsys)
    await traffic(redis, f"{va}:0.5,{vb}:0.5", good={va, vb}, n=200, at=now() + 100,
                  tag=f"b{unique}")  # fmt: skip
    now.now += 2000
    tick = await first.tick()
    assert tick.decision is not None and tick.decision.action == "hold" and not tick.acted
    monkeypatch.setattr(clock, "now_ms", now)
    report = json.loads(await cli("status", "--json", capsys=capsys))
    assert report["rollout"]["status"] == "paused" and report["baseline"] == va
    assert {row["version"] for row in report["versions"]} == {va, vb}
    new_row = next(row for row in report["versions"] if row["version"] == vb)
    assert new_row["share"] == 0.5 and new_row["requests"] > 50
    assert new_row["vs_baseline"]["auc"]["verdict"] in ("not yet significant", "better", "worse")
    assert [c["status"] for c in report["rollout"]["checks"]] == ["pass", "pass"]
    text = await cli("status", capsys=capsys)
    assert vb in text and "guard auc not worse by more than 0.01: pass" in text
    assert "resumed" in await cli("resume", capsys=capsys)

    # a split changed behind the rollout's back pauses it; resume restores the step's split
    await redis.set(keys.model_split(), f"{va}:0.9,{vb}:0.1")
    tick = await first.tick()
    assert tick.state is not None and tick.state.status == "paused"
    assert "changed outside the rollout" in tick.state.reason
    await cli("resume", capsys=capsys)
    assert await redis.get(keys.model_split()) == f"{va}:0.5,{vb}:0.5".encode()

    # the first driver dies holding the lease; the second takes over once it expires and
    # rolls back at once when the new version turns bad
    await redis.pexpire(keys.rollout_lease(), 1)
    await traffic(redis, f"{va}:0.5,{vb}:0.5", good={va}, n=400, at=now() + 100, tag=f"c{unique}")
    now.now += 200
    tick = await second.tick()
    assert tick.lease and tick.acted and tick.state is not None
    assert tick.state.status == "rolled_back" and "auc worse" in tick.state.reason
    assert await redis.get(keys.active_model()) == va.encode()
    assert await redis.get(keys.model_split()) is None
    assert second.metrics.rollbacks.labels("auc")._value.get() == 1
    history = [h["action"] for h in await RolloutStore(redis=redis).history()]
    assert history == ["start", "advance", "pause", "resume", "pause", "resume", "rollback"]
    assert (await first.tick()).state.status == "rolled_back"  # type: ignore[union-attr]
    assert await first.run() is not None  # a finished rollout: the driver returns at once


async def test_abort_returns_every_user_to_the_old_version(
    redis: aioredis.Redis, tiny_artifacts: tuple[Path, Path], pointers: None, stack: StackInfo,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("STREAMRANK_REDIS_URL", stack.redis_url)
    va, vb = await publish(redis, tiny_artifacts[0]), await publish(redis, tiny_artifacts[1])
    await redis.delete(keys.model_split(), keys.rollout_state(), keys.rollout_lease())
    await redis.set(keys.active_model(), va)
    # refusals that say what to do
    assert await run_main(["rollout", "start", va, "--no-drive"]) == 1
    assert "already the active version" in capsys.readouterr().err
    assert await run_main(["rollout", "start", vb, "--steps", "5,20", "--no-drive"]) == 1
    assert "end at 100" in capsys.readouterr().err
    out = await cli("start", vb, "--steps", "10,100", "--no-drive", capsys=capsys)
    assert "started at 10%" in out and "rollout drive" in out
    assert await run_main(["rollout", "start", vb, "--no-drive"]) == 1
    assert "abort it first" in capsys.readouterr().err
    assert "aborted" in await cli("abort", capsys=capsys)
    assert await redis.get(keys.active_model()) == va.encode()
    assert await redis.get(keys.model_split()) is None
    assert await run_main(["rollout", "abort"]) == 1
    assert "nothing to abort" in capsys.readouterr().err
