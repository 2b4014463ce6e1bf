"""`streamrank bench report`: the series taken out of the benchmarks' JSON (real results, as
the benchmarks print them), the errors on missing keys, and the four figures drawn as PNGs."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from streamrank.errors import ConfigError
from workbench.bench import report, report_series
from workbench.cli.main import main

# docs/benchmarks.md, "Scoring worker", the quiet-machine run of 2026-11-29 (trimmed to the
# keys the report reads, plus the worker's other keys left as they were).
SCORING: dict[str, Any] = {
    "max_rps_by_forward": {"per_request": 649.4, "batched": 441.1},
    "latency": {
        "100": {"sent": 1000, "answered": 1000, "degraded": 0, "p50_ms": 11.65,
                "p99_ms": 17.25, "max_ms": 21.56,
                "worker_stage_ms_mean": {"queue_wait": 2.73, "sequence_fetch": 0.73,
                                         "embedding_lookup": 1.18, "forward": 1.66,
                                         "total": 6.67}},
        "200": {"sent": 2000, "answered": 2000, "degraded": 0, "p50_ms": 15.17,
                "p99_ms": 48.74, "max_ms": 94.47,
                "worker_stage_ms_mean": {"queue_wait": 5.73, "sequence_fetch": 1.04,
                                         "embedding_lookup": 1.32, "forward": 1.69,
                                         "total": 10.08}},
        "400": {"sent": 4000, "answered": 4000, "degraded": 0, "p50_ms": 180.82,
                "p99_ms": 1014.5, "max_ms": 1275.3,
                "worker_stage_ms_mean": {"queue_wait": 195.01, "sequence_fetch": 9.12,
                                         "embedding_lookup": 9.37, "forward": 19.25,
                                         "total": 234.63}},
    },
    "saturation_stage_ms_mean": {
        "per_request": {"queue_wait": 3137.82, "sequence_fetch": 17.93,
                        "embedding_lookup": 15.22, "forward": 27.27, "total": 3200.51},
        "batched": {"queue_wait": 4462.41, "sequence_fetch": 18.76, "embedding_lookup": 18.39,
                    "forward": 42.98, "total": 4545.23},
    },
    "max_rps": 649.4,
    "naive_max_rps": 29.6,
    "forward_only_rps": 1536.3,
    "config": {"items": 1000000, "candidates": 100, "history": 50, "cpus": 2},
}  # fmt: skip
# The echo baseline's shape as issue 13 specifies it (numbers of the kind it would give).
ECHO = {"max_rps": 2210.5, "latency": {"100": {"p50_ms": 6.1, "p99_ms": 9.8},
                                       "200": {"p50_ms": 7.4, "p99_ms": 21.3},
                                       "400": {"p50_ms": 9.9, "p99_ms": 40.2}}}  # fmt: skip
# `streamrank bench embeddings --private-redis --rows 100000 --batches 3000
#  --latency-batches 300 --capacities 0.005,0.01,0.02,0.05,0.1,0.2 --json` (2026-12-01).
EMBEDDINGS: dict[str, Any] = {
    "rows": 100000, "dim": 32, "zipf": 1.05, "trace_batches": 3000, "batch_size": 150,
    "hit_rate": {
        "0.005": {"ours_tinylfu": 0.4561, "lru": 0.337, "belady": 0.5421,
                  "ours_minus_lru_points": 11.91},
        "0.01": {"ours_tinylfu": 0.5273, "lru": 0.4239, "belady": 0.6145,
                 "ours_minus_lru_points": 10.33},
        "0.02": {"ours_tinylfu": 0.5906, "lru": 0.5119, "belady": 0.6822,
                 "ours_minus_lru_points": 7.87},
        "0.05": {"ours_tinylfu": 0.6789, "lru": 0.6238, "belady": 0.7625,
                 "ours_minus_lru_points": 5.51},
        "0.1": {"ours_tinylfu": 0.7387, "lru": 0.7054, "belady": 0.8104,
                "ours_minus_lru_points": 3.33},
        "0.2": {"ours_tinylfu": 0.792, "lru": 0.7806, "belady": 0.8402,
                "ours_minus_lru_points": 1.14},
    },
    "lookup_p50_us": 612.3,
    "lookup_p99_us": 1021.7,
}  # fmt: skip
# docs/benchmarks-streams.md, the first quiet-machine run of 2026-11-29.
STREAMS: dict[str, Any] = {
    "events": 200000, "users": 10000, "features_path": "batch", "batch_size": 2000,
    "produce_per_s": 70337.6, "raw_consume_per_s": 187638.8, "events_per_s": 59797.5,
    "events_per_s_vs_raw": 0.319, "latency_p50_ms": 10.85, "latency_p99_ms": 26.18,
    "cpu_count": 2,
}  # fmt: skip


def with_echo() -> dict[str, Any]:
    return {**copy.deepcopy(SCORING), "echo": copy.deepcopy(ECHO)}


# --- series ------------------------------------------------------------------------------------


def test_scoring_series_ours_echo_and_the_max_rps_bars() -> None:
    series = report_series.scoring_series(with_echo(), source="s.json")
    assert series.ours.rates == (100.0, 200.0, 400.0)
    assert series.ours.p50_ms == (11.65, 15.17, 180.82)
    assert series.ours.p99_ms == (17.25, 48.74, 1014.5)
    assert series.echo is not None
    assert series.echo.p99_ms == (9.8, 21.3, 40.2)
    assert series.max_rps == {"ours": 649.4, "echo floor": 2210.5, "naive": 29.6,
                              "forward only": 1536.3}  # fmt: skip
    assert list(series.max_rps) == ["ours", "echo floor", "naive", "forward only"]
    assert "1,000,000 items" in series.title and "2 CPUs" in series.title


def test_scoring_series_adds_the_true_floor_and_the_previous_scorer_when_run() -> None:
    floor = {"max_rps": 3100.0, "latency": {"200": {"p50_ms": 3.1, "p99_ms": 7.9},
                                            "100": {"p50_ms": 2.9, "p99_ms": 6.2}}}  # fmt: skip
    result = {**with_echo(), "floor": floor,
              "runtime_ab": {"previous": {"max_rps": 402.5}, "current": {"max_rps": 700.1}}}  # fmt: skip
    series = report_series.scoring_series(result, source="s.json")

    assert series.floor is not None and series.floor.label == "true floor"
    assert series.floor.rates == (100.0, 200.0) and series.floor.p99_ms == (6.2, 7.9)
    assert list(series.max_rps) == [
        "ours", "echo floor", "true floor", "previous scorer", "naive", "forward only",
    ]  # fmt: skip
    assert series.max_rps["true floor"] == 3100.0
    assert series.max_rps["previous scorer"] == 402.5


def test_scoring_series_sorts_rates_numerically_and_skips_a_rate_without_replies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    result = copy.deepcopy(SCORING)
    result["latency"]["50"] = {"sent": 500, "answered": 0, "degraded": 0}  # no percentiles
    result["latency"]["1000"] = {"p50_ms": 900.0, "p99_ms": 2000.0}
    with caplog.at_level(logging.WARNING):
        series = report_series.scoring_series(result, source="s.json")
    assert series.ours.rates == (100.0, 200.0, 400.0, 1000.0)  # not "1000" < "200" as text
    assert series.ours.p99_ms[-1] == 2000.0
    assert "latency at 50 req/s has no p50/p99" in caplog.text


def test_scoring_series_without_echo_draws_ours_and_naive_and_says_echo_is_missing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        series = report_series.scoring_series(SCORING, source="s.json")
    assert series.echo is None
    assert series.max_rps == {"ours": 649.4, "naive": 29.6, "forward only": 1536.3}
    assert "s.json has no echo baseline" in caplog.text


@pytest.mark.parametrize(
    ("drop", "named"),
    [
        (("latency",), "'latency'"),
        (("naive_max_rps",), "'naive_max_rps'"),
        (("echo", "max_rps"), "'echo.max_rps'"),
        (("latency", "200", "worker_stage_ms_mean"), "'latency.200.worker_stage_ms_mean'"),
    ],
)
def test_a_missing_scoring_key_names_it_and_the_command_that_makes_it(
    drop: tuple[str, ...], named: str
) -> None:
    result = with_echo()
    parent = result
    for part in drop[:-1]:
        parent = parent[part]
    del parent[drop[-1]]
    with pytest.raises(ConfigError) as err:
        report_series.scoring_series(result, source="s.json")
        report_series.stage_bars(result, source="s.json")
    assert named in str(err.value)
    assert "s.json" in str(err.value)
    assert "streamrank bench scoring --json --out scoring.json" in str(err.value)


def test_a_value_that_is_not_a_number_is_an_error_not_a_plot() -> None:
    result = copy.deepcopy(SCORING)
    result["max_rps"] = "fast"
    with pytest.raises(ConfigError, match="max_rps is 'fast', not a number"):
        report_series.scoring_series(result, source="s.json")


def test_stage_bars_per_offered_rate_and_saturated_mode_with_the_rest_as_other() -> None:
    bars = report_series.stage_bars(SCORING, source="s.json")
    assert bars.labels == ("100 req/s", "200 req/s", "400 req/s", "saturated\nper_request",
                           "saturated\nbatched")  # fmt: skip
    assert bars.stages == ("queue_wait", "sequence_fetch", "embedding_lookup", "forward", "other")
    assert bars.ms["queue_wait"][:3] == (2.73, 5.73, 195.01)
    assert bars.ms["forward"][3:] == (27.27, 42.98)
    # 100 req/s: total 6.67 - (2.73 + 0.73 + 1.18 + 1.66) = 0.37 ms outside the named stages
    assert bars.ms["other"][0] == pytest.approx(0.37)
    assert bars.totals == (6.67, 10.08, 234.63, 3200.51, 4545.23)
    for n, total in enumerate(bars.totals):
        assert sum(bars.ms[s][n] for s in bars.stages) == pytest.approx(total)


def test_stage_bars_keep_a_stage_we_do_not_know_and_a_reply_without_total() -> None:
    result = copy.deepcopy(SCORING)
    del result["saturation_stage_ms_mean"]
    result["latency"]["100"]["worker_stage_ms_mean"] = {"queue_wait": 2.0, "decode": 0.5,
                                                        "forward": 1.5}  # fmt: skip
    bars = report_series.stage_bars(result, source="s.json")
    assert bars.stages == ("queue_wait", "sequence_fetch", "embedding_lookup", "forward",
                           "decode", "other")  # fmt: skip
    assert bars.ms["decode"] == (0.5, 0.0, 0.0)
    assert bars.ms["other"][0] == 0.0 and bars.totals[0] == 4.0


def test_hit_rate_series_in_percent_by_cache_size() -> None:
    series = report_series.hit_rate_series(EMBEDDINGS, source="e.json")
    assert series.capacity_pct == pytest.approx((0.5, 1.0, 2.0, 5.0, 10.0, 20.0))
    assert series.curves["ours (W-TinyLFU)"] == pytest.approx(
        (45.61, 52.73, 59.06, 67.89, 73.87, 79.2)
    )
    assert series.curves["LRU"][0] == pytest.approx(33.7)
    assert series.curves["Belady (optimum)"][-1] == pytest.approx(84.02)
    assert list(series.curves) == ["ours (W-TinyLFU)", "LRU", "Belady (optimum)"]
    assert "100,000 ids" in series.title


def test_hit_rate_without_the_simulation_names_the_embeddings_command() -> None:
    result = {k: v for k, v in EMBEDDINGS.items() if k != "hit_rate"}
    with pytest.raises(ConfigError, match="streamrank bench embeddings --json --out"):
        report_series.hit_rate_series(result, source="e.json")
    broken = copy.deepcopy(EMBEDDINGS)
    del broken["hit_rate"]["0.05"]["belady"]
    with pytest.raises(ConfigError, match=r"'hit_rate\.0\.05\.belady'"):
        report_series.hit_rate_series(broken, source="e.json")


def test_streams_series_one_pair_of_bars_per_run_named_by_its_file() -> None:
    second = {**STREAMS, "events": 50000, "raw_consume_per_s": 73564.2,
              "events_per_s": 13727.1, "latency_p99_ms": 89.83}  # fmt: skip
    series = report_series.streams_series([("runs/quiet.json", STREAMS), ("shared.json", second)])
    assert series.runs == ("quiet\n200,000 clicks", "shared\n50,000 clicks")
    assert series.events_per_s == (59797.5, 13727.1)
    assert series.raw_consume_per_s == (187638.8, 73564.2)
    assert series.latency_p50_ms == (10.85, 10.85)
    assert series.latency_p99_ms == (26.18, 89.83)
    assert "batch path, 2 CPUs" in series.title
    with pytest.raises(ConfigError, match=r"b\.json has no 'raw_consume_per_s'.*bench streams"):
        report_series.streams_series([("a.json", STREAMS), ("b.json", {"events_per_s": 1.0})])


def test_titles_say_what_a_result_does_not_tell_as_a_question_mark() -> None:
    bare = {k: v for k, v in SCORING.items() if k != "config"}
    assert report_series.scoring_series(bare, source="s.json").title == (
        "Scoring, end to end through the broker"
    )
    partial = {**SCORING, "config": {"candidates": 100}}
    assert "? items, 100 candidates" in report_series.scoring_series(partial, source="s").title
    rows_unknown = {k: v for k, v in EMBEDDINGS.items() if k != "rows"}
    assert "(? ids" in report_series.hit_rate_series(rows_unknown, source="e.json").title
    assert report_series.streams_series([("x.json", {"events_per_s": 1.0,
                                                     "raw_consume_per_s": 2.0})]).runs == (
        "x\n? clicks",
    )  # fmt: skip


def test_load_result_says_what_makes_a_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist: make it with `streamrank bench"):
        report_series.load_result(tmp_path / "nope.json", "streams")
    bad = tmp_path / "bad.json"
    bad.write_text("streams: 1\n")
    with pytest.raises(ConfigError, match="is not JSON"):
        report_series.load_result(bad, "streams")
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="holds no JSON object"):
        report_series.load_result(bad, "streams")


# --- figures -----------------------------------------------------------------------------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path, *, min_width: int, min_height: int) -> None:
    """A real PNG: the signature, a size a drawn figure has, and pixels that are not blank."""
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert 15_000 < len(data) < 150_000, (path, len(data))
    pixels = imread(path)  # [height, width, channels]
    height, width = pixels.shape[:2]
    assert width >= min_width and height >= min_height, (path, pixels.shape)
    assert pixels[..., :3].std() > 0.05, path  # lines and bars, not one flat colour


def test_report_draws_all_four_figures_as_pngs_and_writes_its_result(tmp_path: Path) -> None:
    inputs = {"scoring": with_echo(), "embeddings": EMBEDDINGS, "streams": STREAMS}
    for name, result in inputs.items():
        (tmp_path / f"{name}.json").write_bytes(orjson.dumps(result))
    streams_again = tmp_path / "streams2.json"
    streams_again.write_bytes(orjson.dumps({**STREAMS, "events_per_s": 63033.1}))
    out = tmp_path / "report.json"
    code = main(["bench", "report", "--scoring", str(tmp_path / "scoring.json"),
                 "--embeddings", str(tmp_path / "embeddings.json"),
                 "--streams", str(tmp_path / "streams.json"), str(streams_again),
                 "--docs", str(tmp_path / "docs"), "--out", str(out)])  # fmt: skip
    assert code == 0
    figures = tmp_path / "docs" / "figures"
    assert sorted(p.name for p in figures.iterdir()) == sorted(report.FILES.values())
    for path in figures.iterdir():
        assert_png(path, min_width=700, min_height=400)
    written = orjson.loads(out.read_bytes())  # the common --out of `streamrank bench`
    assert written["figures"] == {k: str(figures / v) for k, v in report.FILES.items()}
    assert written["not_drawn"] == [] and written["echo_baseline"] is True


def test_report_draws_only_what_it_is_given_and_checks_inputs_before_drawing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "embeddings.json"
    good.write_bytes(orjson.dumps(EMBEDDINGS))
    code = main(["bench", "report", "--embeddings", str(good), "--docs", str(tmp_path), "--json"])
    assert code == 0
    printed = orjson.loads(capsys.readouterr().out)
    assert list(printed["figures"]) == ["cache_hit_rate"]
    assert printed["not_drawn"] == ["scoring_latency", "scoring_stages", "streams_throughput"]
    assert_png(tmp_path / "figures" / "cache_hit_rate.png", min_width=700, min_height=400)

    empty = tmp_path / "empty"
    broken = tmp_path / "streams.json"
    broken.write_bytes(orjson.dumps({"events": 10}))
    code = main(["bench", "report", "--embeddings", str(good), "--streams", str(broken),
                 "--docs", str(empty)])  # fmt: skip
    assert code == 1
    assert (
        "has no 'events_per_s': make it with `streamrank bench streams" in capsys.readouterr().err
    )
    assert not empty.exists()  # nothing drawn: the bad input was found first

    assert main(["bench", "report", "--docs", str(empty)]) == 1
    assert "give at least one of --scoring" in capsys.readouterr().err


def test_the_inputs_kept_for_the_docs_figures_still_give_every_figure() -> None:
    data = Path(__file__).resolve().parents[3] / "docs" / "figures" / "data"
    scoring = report_series.load_result(data / "scoring.json", "scoring")
    assert report_series.scoring_series(scoring, source="scoring.json").ours.rates
    assert report_series.stage_bars(scoring, source="scoring.json").labels
    embeddings = report_series.load_result(data / "embeddings.json", "embeddings")
    assert len(report_series.hit_rate_series(embeddings, source="e").capacity_pct) == 6
    streams = [(p.name, report_series.load_result(p, "streams"))
               for p in sorted(data.glob("streams-*.json"))]  # fmt: skip
    assert len(report_series.streams_series(streams).runs) == 2
    for name in report.FILES.values():
        assert (data.parent / name).stat().st_size < 150_000, name
