"""The cascade's stage functions and budgets alone (no service): retrieval through a retriever,
the coarse cut, categories for the rerank, each stage's allowance and the thread runner."""

from __future__ import annotations

import time

import numpy as np
import pytest

from scoring.serving.budget import StageBudgets, in_thread
from scoring.serving.cascade_stages import (
    categories_of,
    coarse_cut,
    finite,
    rerank_stage,
    search,
    user_vectors,
    with_hot,
)
from streamrank.settings import CascadeSettings
from tests.unit.serving.cascade_fakes import BruteForceRetriever

ITEMS = [f"i{k}" for k in range(12)]


def test_search_returns_raw_ids_best_first_without_padding() -> None:
    r = BruteForceRetriever(ITEMS[:3])
    users = user_vectors(r, [["i0"], []])
    assert users.shape == (2, r.dim) and users.dtype == np.float32
    found = search(r, users, 5)  # more than the catalogue: padding (-1) is dropped
    assert [sorted(f) for f in found] == [sorted(ITEMS[:3])] * 2
    assert found[0][0] == "i0"  # its own vector is the nearest


def test_hot_items_follow_the_index_candidates_once() -> None:
    assert with_hot(["a", "b"], ["b", "c", "d"], retrieve=2, hot_merge=2) == ["a", "b", "c"]
    assert with_hot(["a", "b"], ["c"], retrieve=2, hot_merge=0) == ["a", "b"]


def test_the_coarse_cut_orders_by_dot_product_and_keeps_unknown_ids_last() -> None:
    r = BruteForceRetriever(ITEMS)
    users = r.user_vectors([["i1", "i2"]])
    cands = ["zz-unknown", *ITEMS]
    ((kept, scores),) = coarse_cut(r, users, [cands], 20)
    dots = users[0] @ r.vectors.T
    assert kept[:-1] == [ITEMS[i] for i in np.argsort(-dots, kind="stable")]
    assert kept[-1] == "zz-unknown" and np.isfinite(scores).all()
    assert scores[-1] < scores[-2]
    ((kept, _),) = coarse_cut(r, users, [cands], 3)
    assert len(kept) == 3


def test_without_a_retriever_the_coarse_cut_keeps_candidate_order() -> None:
    cut = coarse_cut(None, None, [["c", "a", "b"], []], 2)
    assert cut[0][0] == ["c", "a"] and list(cut[0][1]) == [0.5, 0.5]
    assert cut[1][0] == []


def test_finite_puts_non_finite_scores_below_the_rest() -> None:
    out = finite(np.array([0.3, -np.inf, -0.5, np.nan], dtype=np.float32))
    assert np.isfinite(out).all() and out[1] == out[3] == pytest.approx(-1.5)
    assert list(finite(np.array([-np.inf], dtype=np.float32))) == [0.0]


def test_the_rerank_caps_categories_from_the_retriever_and_returns_top_k() -> None:
    r = BruteForceRetriever(["a", "b", "c", "d"], ["x", "x", "y", ""])
    assert categories_of(r, ["a", "c", "d", "zz"]) == ["x", "y", "", ""]
    assert categories_of(None, ["a"]) == [""]
    scores = np.array([0.9, 0.8, 0.7, 0.6], dtype=np.float32)
    items, values = rerank_stage(r, ["a", "b", "c", "d"], scores, top_k=2, window=4,
                                 category_cap=1)  # fmt: skip
    assert items == ["a", "c"] and list(values) == pytest.approx([0.9, 0.7])
    # a top_k wider than the window is still served
    items, _ = rerank_stage(r, ["a", "b", "c", "d"], scores, top_k=4, window=2, category_cap=0)
    assert items == ["a", "b", "c", "d"]


def test_a_stage_gets_its_budget_or_what_the_deadline_leaves_after_the_later_stages() -> None:
    budgets = StageBudgets.from_settings(CascadeSettings())  # 15, 5, 10, 40, 10 ms
    # rank can be skipped (the coarse order), so no earlier stage goes short for it
    assert budgets.after("retrieval") == 25 and budgets.after("coarse") == 10
    assert budgets.after("rerank") == 0
    assert budgets.allowance_ms("retrieval", now_ms=0, deadline_ms=1000) == 15
    assert budgets.allowance_ms("retrieval", now_ms=0, deadline_ms=35) == 10
    assert budgets.allowance_ms("rank", now_ms=0, deadline_ms=30) == 20
    assert budgets.allowance_ms("rank", now_ms=40, deadline_ms=30) == 0


async def test_a_thread_stage_is_not_waited_for_past_its_timeout() -> None:
    assert await in_thread(lambda: 7, timeout_s=1.0) == 7
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await in_thread(lambda: time.sleep(0.5), timeout_s=0.05)
    assert time.monotonic() - started < 0.4
    ran: list[int] = []
    with pytest.raises(TimeoutError):
        await in_thread(lambda: ran.append(1), timeout_s=0.0)
    assert ran == []  # no time: never started


def test_search_stops_before_a_search_it_would_not_finish_and_leaves_the_rest_to_fall_back() -> (
    None
):
    from tests.unit.serving.cascade_fakes import SlowRetriever

    r = SlowRetriever(ITEMS, delay_s=0.03)
    users = user_vectors(r, [["i0"], ["i1"], ["i2"], ["i3"]])
    found = search(r, users, 3, end=time.perf_counter() + 0.045)
    # the first search took 30 ms; a second one would end past 45 ms, so it is not started
    assert found[0] is not None and found[0][0] == "i0"
    assert found[1:] == [None, None, None]
    assert search(r, users[:1], 3, end=time.perf_counter() - 1) == [None]  # no time: no search
