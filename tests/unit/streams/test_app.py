from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from streamrank.settings import Settings
from streams.app import create_app, mark_processing, report_lag
from streams.classify import Record


class TP(NamedTuple):
    topic: str
    partition: int


class Msg(NamedTuple):
    tp: TP
    offset: int


async def _handler(batch: Sequence[Record]) -> None:
    return None


def test_app_creates_its_data_dir_in_a_fresh_checkout(tmp_path: Path) -> None:
    run_dir = tmp_path / "fresh" / ".run"  # nothing exists yet, as in a new clone
    app = create_app(Settings().with_env(STREAMRANK_RUN_DIR=run_dir), handler=_handler)
    assert (run_dir / "faust").is_dir()
    assert Path(app.conf.datadir).resolve().is_relative_to((run_dir / "faust").resolve())


def test_lag_is_reported_only_for_partitions_still_assigned() -> None:
    """A rebalance that moves a partition away while its batch is written must not stop the
    worker: aiokafka asserts assignment when reading a high watermark."""
    kept, moved, racing = TP("clicks", 0), TP("clicks", 1), TP("clicks", 2)
    marks = {kept: 10, moved: 50, racing: 70}

    def highwater(tp: TP) -> int:
        assert tp != racing, "Partition is not assigned"  # revoked after the check
        return marks[tp]

    messages = [Msg(kept, 3), Msg(kept, 6), Msg(moved, 20), Msg(racing, 30)]
    reported: list[tuple[str, int, int]] = []
    report_lag(
        messages, assigned={kept, racing}, highwater=highwater,
        on_lag=lambda t, p, n: reported.append((t, p, n)),
    )  # fmt: skip
    assert reported == [("clicks", 0, 3)]  # 10 - (6 + 1): the last offset of the batch


def test_batches_count_as_stream_processing_for_fausts_monitor() -> None:
    """Faust's event-path check reads the monitor's stream_inbound_time; without it every
    partition with lag is reported as "Stream has not started processing"."""

    class Monitor:
        def __init__(self) -> None:
            self.stream_inbound_time: dict[TP, float] = {}

    monitor = Monitor()
    a, b = TP("clicks", 0), TP("clicks", 1)
    mark_processing(monitor, [Msg(a, 1), Msg(a, 2), Msg(b, 7)], now=12.5)
    assert monitor.stream_inbound_time == {a: 12.5, b: 12.5}
    mark_processing(None, [Msg(a, 3)], now=13.0)  # an app without a monitor: nothing to tell
