"""The CLI turns SIGTERM into Ctrl-C when it runs in the main thread, and runs in other threads
too (tests and tools call ``main`` from worker threads, where no handler may be set)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from workbench.cli.main import main


@pytest.fixture
def default_sigterm() -> Iterator[None]:
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def test_main_in_a_thread_runs_and_leaves_the_handler_alone(
    default_sigterm: None, capsys: pytest.CaptureFixture[str]
) -> None:
    codes: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            codes.append(main(["settings"]))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not errors, errors
    assert codes == [0]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert '"bootstrap"' in capsys.readouterr().out


def test_main_in_the_main_thread_turns_sigterm_into_an_interrupt(
    default_sigterm: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["settings"]) == 0
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler)
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGTERM, None)
