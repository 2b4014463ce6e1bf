"""The tools' own settings: the embedded dev stack, datasets and trained artifacts."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from streamrank.settings.base import Section


def _default_data_dir() -> Path:
    return Path(__file__).resolve().parent.parent.parent.parent / "shared" / "datasets"


def _default_data_cache_dir() -> Path:
    # expanduser, not Path.home(): a worker with no home directory must still read its settings
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "streamrank" / "datasets"


class ToolSettings(Section):
    """The workbench's settings: the embedded stack of the demo and tests, datasets and
    trained artifacts. No worker reads them in production, except that the features worker
    keeps Faust's small data directory under run_dir."""

    run_dir: Path = Field(
        Path(".run"), description="Pid, log and data files of the embedded stack."
    )
    stack_kafka_port: int = Field(9092, ge=0, le=65535, description="Port of the embedded broker.")
    stack_redis_port: int = Field(6379, ge=0, le=65535, description="Port of the embedded Redis.")
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Datasets folder (default ../shared/datasets).",
    )
    data_cache_dir: Path = Field(
        default_factory=_default_data_cache_dir,
        description="Where `streamrank data fetch` puts datasets when data_dir is not writable; "
        "searched after data_dir (default ~/.cache/streamrank/datasets).",
    )
    movielens_url: str = Field(
        "https://recbole.s3-accelerate.amazonaws.com/ProcessedDatasets/MovieLens/ml-100k.zip",
        description="Zip of MovieLens-100K in RecBole atomic files, for "
        "`streamrank data fetch movielens`.",
    )
    artifacts_dir: Path = Field(
        Path("artifacts"), description="Where `streamrank train` writes versions."
    )
