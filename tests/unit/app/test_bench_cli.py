"""`streamrank bench NAME`: the options every benchmark shares (``--json``, ``--out PATH``)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from workbench.cli.bench import BENCHMARKS, bench_parser, write_result


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_takes_json_and_out_without_a_clash_of_options(name: str) -> None:
    # argparse refuses a parser whose benchmark defines --out or --json again
    parser = bench_parser(name)
    dests = {a.dest: a for a in parser._actions}
    assert dests["out"].option_strings == ["--out"] and dests["out"].type is Path
    assert dests["json"].option_strings == ["--json"]


def test_drive_keeps_its_records_directory_under_records() -> None:
    args = bench_parser("drive").parse_args(["--records", "run", "--out", "drive.json"])
    assert args.records == Path("run") and args.out == Path("drive.json")
    with pytest.raises(SystemExit):
        bench_parser("drive").parse_args([])  # --records is required


def test_write_result_writes_the_json_whole_and_creates_its_folder(tmp_path: Path) -> None:
    import numpy as np

    result = {"max_rps": 649.4, "latency": {"200": {"p99_ms": np.float64(48.74)}}}
    path = tmp_path / "a" / "b" / "scoring.json"
    write_result(path, result)
    assert orjson.loads(path.read_bytes()) == {
        "max_rps": 649.4,
        "latency": {"200": {"p99_ms": 48.74}},
    }
    assert [p.name for p in path.parent.iterdir()] == ["scoring.json"]  # no temporary left


def test_every_result_records_the_load_average_before_and_after_its_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import types

    from workbench.cli import bench

    loads = iter([(0.5, 0.25, 0.125), (1.75, 0.5, 0.25)])
    monkeypatch.setattr(bench.os, "getloadavg", lambda: next(loads))
    fake = types.SimpleNamespace(add_arguments=lambda parser: None,
                                 run=lambda args, settings: {"max_rps": 1.0})  # fmt: skip
    monkeypatch.setitem(bench.BENCHMARKS, "fake", (lambda: fake, "a benchmark for this test"))
    out = tmp_path / "fake.json"
    args = argparse.Namespace(bench="fake", bench_args=["--json", "--out", str(out)])
    assert bench._run(args, settings=None) == 0  # type: ignore[arg-type]
    expected = {"max_rps": 1.0, "load_average": {"before": [0.5, 0.25, 0.12],
                                                  "after": [1.75, 0.5, 0.25]}}  # fmt: skip
    assert orjson.loads(capsys.readouterr().out) == expected
    assert orjson.loads(out.read_bytes()) == expected
