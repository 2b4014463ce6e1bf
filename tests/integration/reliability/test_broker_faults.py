"""Faults 5 and 6: the broker unreachable when the workers start, and the broker stalled
(SIGSTOP 10 s) under load. Each test has a broker of its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

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
from workbench.devstack.servers import KafkaBroker
from workbench.devstack.services import free_port

pytestmark = pytest.mark.timeout(420)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A private broker, not started yet."""
    server = KafkaBroker(port=free_port(), run_dir=tmp_path)
    try:
        yield server
    finally:
        server.stop()


async def wait_logged(worker: object, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in worker.log_text():  # type: ignore[attr-defined]
        assert worker.alive(), worker.log_text()[-3000:]  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"{text!r} not logged"
        await asyncio.sleep(0.2)


async def test_broker_unreachable_at_start_then_appears(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path], broker: KafkaBroker,
) -> None:  # fmt: skip
    """Both workers start before the broker: one clear line each, retries with back-off, and
    they serve once it is up (a pod that starts first does not crash-loop)."""
    with rig(make_settings, unique, tmp_path, tiny_artifacts[0],
             STREAMRANK_KAFKA_BOOTSTRAP=broker.bootstrap) as r:  # fmt: skip
        features = r.worker("features", "features", ready=False)
        scoring = r.worker("scoring", "scoring", ready=False)
        for worker in (features, scoring):
            await wait_logged(worker, "is unreachable", 60)
        await asyncio.sleep(4)  # several retries
        appeared = now_ms()
        await asyncio.to_thread(broker.start)
        await r.prepare()  # topics and the model, now that there is a broker
        await asyncio.to_thread(features.wait_ready, 120)
        await asyncio.to_thread(scoring.wait_ready, 120)
        ready_s = round((now_ms() - appeared) / 1000, 1)
        r.drive(seconds=8, click_rate=50, request_rate=30)
        run = await r.finish()
        await assert_clicks_applied_once(r.settings, run)
        assert_alive(features, scoring)
    assert_all_answered(run)
    for worker in (features, scoring):
        log = worker.log_text()
        assert log.count("is unreachable") == 1, log[-3000:]  # one line, not one per retry
        assert "answered after" in log
    report("broker unreachable at start (appears after 4 s)", run, start_ms=appeared,
           end_ms=appeared, serving_after_broker_s=ready_s)  # fmt: skip


async def test_broker_unreachable_past_the_limit_is_a_clear_exit(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path],
) -> None:  # fmt: skip
    nowhere = f"127.0.0.1:{free_port()}"
    with rig(make_settings, unique, tmp_path, tiny_artifacts[0], STREAMRANK_KAFKA_BOOTSTRAP=nowhere,
             STREAMRANK_KAFKA_START_TIMEOUT_S=3) as r:  # fmt: skip
        workers = [r.worker(kind, kind, ready=False) for kind in ("features", "scoring")]
        for worker in workers:
            worker.process.wait(90)
            assert worker.process.returncode == 1, worker.log_text()[-3000:]
            log = worker.log_text()
            assert f"Kafka at {nowhere} did not answer within 3s" in log, log[-3000:]
            assert "STREAMRANK_KAFKA_START_TIMEOUT_S" in log
            assert "Traceback" not in log, log[-3000:]


async def test_broker_stalled_10s_under_load(
    make_settings: Callable[..., Settings], unique: str, tmp_path: Path,
    tiny_artifacts: tuple[Path, Path], broker: KafkaBroker,
) -> None:  # fmt: skip
    """SIGSTOP for 10 s, then SIGCONT: the workers recover by themselves; the requests whose
    deadline passed while the broker stood still are answered degraded "expired"; no click or
    request is lost."""
    await asyncio.to_thread(broker.start)
    with rig(make_settings, unique, tmp_path, tiny_artifacts[0],
             STREAMRANK_KAFKA_BOOTSTRAP=broker.bootstrap) as r:  # fmt: skip
        await r.prepare()
        features, scoring = r.worker("features", "features"), r.worker("scoring", "scoring")
        r.drive(seconds=35, click_rate=50, request_rate=30, drain_s=120)
        await r.wait_flowing(replies=150)
        stalled_at = now_ms()
        broker.pause()
        await asyncio.sleep(10)
        broker.resume()
        resumed_at = now_ms()
        run = await r.finish()
        await assert_clicks_applied_once(r.settings, run, timeout_s=120)
        assert_alive(features, scoring)
    assert_all_answered(run)
    assert_degraded_only_within(
        run, [(stalled_at - r.settings.scoring.budget_ms, resumed_at + 15_000)],
        reasons={"expired"},
    )  # fmt: skip
    assert run.degraded(), "a 10 s stall with a 3 s budget must expire some requests"
    report("broker stalled (SIGSTOP 10 s)", run, start_ms=stalled_at, end_ms=resumed_at)
