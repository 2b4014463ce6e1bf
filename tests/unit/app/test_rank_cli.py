"""`streamrank rank`'s arguments (candidates or a retrieval request, --top-k, --scene,
--exclude) and its human output (best first, cached, degraded, stage timings)."""

from __future__ import annotations

import pytest

from schemas import RankResult
from workbench.cli.main import build_parser
from workbench.cli.scoring import result_lines


def test_without_items_it_asks_for_retrieval_with_the_new_fields() -> None:
    args = build_parser().parse_args(
        ["rank", "--user", "u1", "--top-k", "3", "--scene", "home", "--exclude", "a, b,"]
    )
    assert args.items is None and args.top_k == 3 and args.scene == "home"
    assert args.exclude == ["a", "b"] and not args.json
    args = build_parser().parse_args(["rank", "--user", "u1", "--items", "x,y", "--json"])
    assert args.items == ["x", "y"] and args.top_k is None and args.scene is None
    assert args.exclude is None and args.json


@pytest.mark.parametrize(
    "bad",
    [["--items", " , "], ["--exclude", ","], ["--top-k", "0"], ["--top-k", "two"]],
)
def test_bad_values_are_refused_by_the_parser(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["rank", "--user", "u1", *bad])
    assert "streamrank rank: error" in capsys.readouterr().err


def test_the_human_output_lists_items_best_first_with_flags_and_timings() -> None:
    result = RankResult(
        "r1", "u1", ("c", "a", "b"), (0.25, 0.75, 0.25), "din-1", degraded=True,
        reason="retrieval_fallback", timings_ms={"retrieval": 1.25, "rank": 3.0}, cached=True,
    )  # fmt: skip
    assert result_lines(result) == [
        "user u1, model din-1, cached, DEGRADED (retrieval_fallback)",
        "  1. 0.7500  a",
        "  2. 0.2500  c",  # equal scores keep the reply's order
        "  3. 0.2500  b",
        "timings (ms): retrieval 1.2, rank 3.0",
    ]
    empty = RankResult("r2", "u1", (), (), "", served_at=1)
    assert result_lines(empty) == ["user u1, model -", "  (no items)", "timings (ms): -"]
