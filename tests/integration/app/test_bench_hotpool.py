"""`streamrank bench hotpool` on a small catalogue: both reads give the same pool (the bench
checks it) and the incremental refresh reads fewer bytes than the whole window."""

from __future__ import annotations

from pathlib import Path

from streamrank.settings import Settings
from workbench.cli.bench import bench_parser


def test_the_bench_runs_and_the_incremental_refresh_reads_less(tmp_path: Path) -> None:
    from workbench.bench import hotpool

    args = bench_parser("hotpool").parse_args(
        ["--items", "3000", "--clicks", "48000", "--refreshes", "3", "--pool", "50"]
    )
    result = hotpool.run(args, Settings().with_env(STREAMRANK_RUN_DIR=str(tmp_path)))
    assert result["bucket_fields"]["24h"] > 0 and result["bucket_fields"]["1h"] > 0
    for window, buckets in (("24h", 24), ("1h", 12)):
        found = result[window]
        assert found["buckets"] == buckets and found["items_clicked"] > 50
        assert len(found["top_3"]) == 3
        full, steady = found["full"], found["incremental"]
        assert steady["first_bytes"] >= full["bytes"] * 0.9
        assert steady["bytes"]["max"] < full["bytes"] * 0.5  # 2 of 12 or 24 buckets
