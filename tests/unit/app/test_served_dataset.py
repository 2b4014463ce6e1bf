"""Exported samples written as Parquet and as JSON lines read back equal; the manifest names the
file's sha256, rows, versions and time range, and a changed file is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scoring.training.served_data import ServedSample
from streamrank.errors import ConfigError
from workbench.cli.dataset import parse_time
from workbench.served_dataset import (
    dataset_info,
    format_of,
    manifest_path,
    read_samples,
    write_manifest,
    write_samples,
)


def samples() -> list[ServedSample]:
    with_features = ServedSample(
        request_id="r1", user_id="u1", model_version="v1", ts=1_700_000_000_000,
        served_at=1_700_000_000_123, history_items=("i1", "i2"), history_ts=(1, 2),
        history_event_ids=("e1", "e2"), history_actions=("click", None), items=("i3", "i4"),
        ranks=(2, 1), labels=(0, 1), scores=(0.123456789012, 0.987654321),
        codes=(3, 0, 7), counters=((1, 2, 3, 4, 5), (0, 0, 0, 0, 2**40)),
        cold_start={"i4": ("Action", "Comedy"), "i2": ("Drama",)},
    )  # fmt: skip
    bare = ServedSample(
        request_id="r2", user_id="u2", model_version="v2", ts=1_700_000_100_000,
        served_at=1_700_000_100_000, history_items=(), history_ts=(), history_event_ids=(),
        history_actions=(), items=("i9",), ranks=(1,), labels=(0,), scores=(0.5,),
    )  # fmt: skip
    return [with_features, bare]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_samples_round_trip(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"samples.{fmt}"
    write_samples(path, samples(), fmt)  # type: ignore[arg-type]
    assert read_samples(path) == samples()
    assert not list(tmp_path.glob(".*.tmp"))


def test_parquet_columns_are_typed(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "s.parquet"
    write_samples(path, samples(), "parquet")
    schema = pq.read_schema(path)
    assert str(schema.field("labels").type) == "list<element: int8>"
    assert str(schema.field("scores").type) == "list<element: double>"
    assert str(schema.field("counters").type) == "list<element: list<element: int64>>"
    cold = schema.field("cold_start").type
    assert str(cold.key_type) == "string" and str(cold.item_type) == "list<element: string>"


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_cold_start_is_an_object_per_row_and_null_without_cold_items(
    tmp_path: Path, fmt: str
) -> None:
    path = tmp_path / f"s.{fmt}"
    write_samples(path, samples(), fmt)  # type: ignore[arg-type]
    if fmt == "jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert rows[0]["cold_start"] == {"i4": ["Action", "Comedy"], "i2": ["Drama"]}
        assert rows[1]["cold_start"] is None
    back = read_samples(path)
    assert back[0].cold_start == {"i4": ("Action", "Comedy"), "i2": ("Drama",)}
    assert back[1].cold_start is None


def test_a_parquet_file_exported_before_cold_start_reads(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "old.parquet"
    write_samples(path, samples(), "parquet")
    pq.write_table(pq.read_table(path).drop_columns(["cold_start"]), path)
    assert [s.cold_start for s in read_samples(path)] == [None, None]


def test_manifest_records_the_file_and_refuses_a_changed_one(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    write_samples(path, samples(), "jsonl")
    manifest = write_manifest(path, samples(), "jsonl", counts={"degraded": 1})
    on_disk = json.loads(manifest_path(path).read_text())
    assert on_disk == manifest
    assert manifest["rows"] == 2 and manifest["served_versions"] == ["v1", "v2"]
    assert manifest["served_at"] == {"min": 1_700_000_000_123, "max": 1_700_000_100_000}
    assert manifest["impressions"] == 3 and manifest["clicks"] == 1
    info = dataset_info(path)
    assert info.sha256 == manifest["sha256"] and info.rows == 2
    assert info.to_json()["served_versions"] == ["v1", "v2"]
    with open(path, "ab") as fh:
        fh.write(b"\n")
    with pytest.raises(ConfigError, match="changed after the export"):
        dataset_info(path)


def test_format_and_times_parse() -> None:
    assert format_of(Path("x.parquet")) == "parquet" and format_of(Path("x"), "jsonl") == "jsonl"
    with pytest.raises(ConfigError, match="--format"):
        format_of(Path("x.csv"))
    assert parse_time("1700000000000") == 1_700_000_000_000
    assert parse_time("2023-11-14T22:13:20") == 1_700_000_000_000
    assert parse_time(None) is None
    with pytest.raises(SystemExit):
        parse_time("yesterday-ish")
