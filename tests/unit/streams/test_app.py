from collections.abc import Sequence
from pathlib import Path

from streamrank.settings import Settings
from streams.app import create_app
from streams.classify import Record


async def _handler(batch: Sequence[Record]) -> None:
    return None


def test_app_creates_its_data_dir_in_a_fresh_checkout(tmp_path: Path) -> None:
    run_dir = tmp_path / "fresh" / ".run"  # nothing exists yet, as in a new clone
    app = create_app(Settings(run_dir=run_dir), handler=_handler)
    assert (run_dir / "faust").is_dir()
    assert Path(app.conf.datadir).resolve().is_relative_to((run_dir / "faust").resolve())
