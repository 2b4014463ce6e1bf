from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scoring.model.cascade import (
    Widths,
    best,
    by_score,
    filter_candidates,
    merge_candidates,
    rerank,
)


def test_merge_keeps_source_order_each_id_once_up_to_the_limit() -> None:
    merged = merge_candidates([["a", "b", "c"], ["c", "d", "a", "e"]], limit=4)
    assert merged == ["a", "b", "c", "d"]
    assert merge_candidates([[], ["x"]], limit=10) == ["x"]


def test_filter_drops_seen_and_excluded_items_only() -> None:
    out = filter_candidates(["a", "b", "c", "d"], seen={"b"}, exclude=("d",))
    assert out == ["a", "c"]
    assert filter_candidates(["a"], seen=set(), exclude=()) == ["a"]


def test_best_sorts_by_score_with_ties_in_candidate_order_and_dedupes() -> None:
    items, scores = best(["a", "b", "c", "b", "d"], [0.5, 0.9, 0.5, 0.7, np.nan], 4)
    assert items == ["b", "a", "c", "d"]  # b's best (0.9) kept; NaN last
    assert scores[:3].tolist() == pytest.approx([0.9, 0.5, 0.5])
    with pytest.raises(ValueError, match="2 candidates but 1 scores"):
        best(["a", "b"], [1.0], 1)


def test_rerank_caps_a_category_and_keeps_the_reply_sorted() -> None:
    items = ["a1", "a2", "a3", "b1", "c1", "a4"]
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    cats = ["A", "A", "A", "B", "C", "A"]
    out, values = rerank(items, scores, cats, top_k=4, window=6, category_cap=2)
    assert out == ["a1", "a2", "b1", "c1"]
    assert np.all(np.diff(values) <= 0)
    # too few other categories: the best capped items fill the reply, still sorted
    out, _ = rerank(items, scores, cats, top_k=5, window=6, category_cap=1)
    assert out == ["a1", "a2", "a3", "b1", "c1"]
    # no cap: plain top_k; unknown categories are never capped
    assert rerank(items, scores, cats, top_k=2, window=6, category_cap=0)[0] == ["a1", "a2"]
    assert rerank(["x", "y"], [1, 2], ["", ""], top_k=2, window=2, category_cap=1)[0] == [
        "y",
        "x",
    ]


def test_rerank_looks_only_at_its_window() -> None:
    out, _ = rerank(["a", "b", "c"], [3, 2, 1], ["A", "A", "B"], top_k=2, window=2, category_cap=1)
    assert out == ["a", "b"]  # c is outside the window: the capped b fills


@given(
    st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(-5, 5), st.sampled_from("XYZ")),
             min_size=1, max_size=30),
    st.integers(1, 10), st.integers(1, 30), st.integers(0, 4),
)  # fmt: skip
def test_rerank_reply_is_sorted_unique_and_capped_when_it_can_be(
    rows: list[tuple[str, float, str]], top_k: int, window: int, cap: int
) -> None:
    items = [r[0] for r in rows]
    cats_of = {r[0]: r[2] for r in rows}
    out, values = rerank(
        items, [r[1] for r in rows], [cats_of[i] for i in items],
        top_k=top_k, window=window, category_cap=cap,
    )  # fmt: skip
    assert len(out) == len(set(out)) <= top_k
    assert np.all(np.diff(values) <= 0)
    if cap:
        counts = {c: sum(cats_of[i] == c for i in out) for c in "XYZ"}
        over = [c for c, n in counts.items() if n > cap]
        # a category exceeds the cap only when the window held too few other items
        assert not over or len(out) == min(top_k, len(set(items)), window)


def test_by_score_and_widths_refuse_nonsense() -> None:
    assert by_score([1.0, 3.0, 2.0]).tolist() == [1, 2, 0]
    with pytest.raises(ValueError, match=">= 1"):
        Widths(retrieve=10, coarse=0, rerank=5)
