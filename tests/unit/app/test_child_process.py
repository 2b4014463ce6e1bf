"""A child's log is appended to across runs: only what this child wrote counts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from streamrank.errors import StreamrankError
from workbench.devstack.processes import start_child


def test_an_earlier_runs_ready_line_does_not_pass_for_this_childs(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("scoring worker consuming rank-requests (the last run)\n")
    child = start_child(
        [sys.executable, "-c", "print('starting', flush=True)"], what="test child", log_path=log
    )
    child.process.wait(30)
    assert child.log_text() == "starting\n"
    assert log.read_text().startswith("scoring worker consuming")  # still appended, not truncated
    with pytest.raises(StreamrankError, match="exited during start-up"):
        child.wait_logged("scoring worker consuming", timeout_s=10)


def test_a_ready_line_this_child_writes_is_found(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("old line\n")
    child = start_child(
        [sys.executable, "-c", "import time; time.sleep(0.5); print('ready', flush=True)"],
        what="test child",
        log_path=log,
    )
    child.wait_logged("ready", timeout_s=30)
    child.process.wait(30)
    assert "old line" not in child.log_text()


def test_a_worker_process_keeps_where_its_log_starts(tmp_path: Path) -> None:
    from streamrank.settings import Settings
    from workbench.devstack.processes import start_worker

    log = tmp_path / "scoring-worker.log"
    log.write_text("scoring worker consuming rank-requests (the last run)\n")
    # Unreachable Kafka: the worker only starts, it never gets as far as consuming.
    settings = Settings().with_env(
        STREAMRANK_KAFKA_BOOTSTRAP="127.0.0.1:1", STREAMRANK_KAFKA_START_TIMEOUT_S=1.0
    )
    worker = start_worker("scoring", settings, log_path=log, metrics_port=0)
    try:
        assert worker.log_start == len("scoring worker consuming rank-requests (the last run)\n")
        assert "the last run" not in worker.log_text()
    finally:
        worker.kill()
