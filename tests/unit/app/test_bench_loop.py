"""The pure parts of `bench loop`: the cut of the log, the candidates of a request, and the
figures from what the arms were served."""

from __future__ import annotations

import numpy as np

from scoring.training.synthetic import generate
from workbench.bench.loop_sim import (
    LoopEvent,
    candidates,
    hit_at,
    later_half_gain,
    period_figures,
    periods,
    plan_loop,
    unseen_scoring,
)


def test_the_plan_cuts_by_time_and_marks_first_appearances_once() -> None:
    ds = generate(n_users=60, n_items=80, seed=2)
    plan = plan_loop(ds, split=0.8, days=None, request_share=0.5, seed=1)
    order = np.lexsort((np.arange(ds.n_events), ds.ts))
    assert len(plan.train_rows) == int(ds.n_events * 0.8)
    assert len(plan.events) == ds.n_events - len(plan.train_rows)
    assert [e.ts_s for e in plan.events] == sorted(e.ts_s for e in plan.events)
    firsts = [e.item for e in plan.events if e.first]
    assert len(firsts) == len(set(firsts)) and not set(firsts) & plan.known
    assert {e.item for e in plan.events} - plan.known == set(firsts)
    assert plan.known == {ds.items[i] for i in ds.item_index[order[: len(plan.train_rows)]]}
    again = plan_loop(ds, split=0.8, days=None, request_share=0.5, seed=1)
    assert [e.request for e in again.events] == [e.request for e in plan.events]
    assert sum(len(d) for d in plan.by_day()) == len(plan.events)


def test_candidates_hold_the_click_once_and_are_drawn_the_same_way_each_time() -> None:
    event = LoopEvent(seq=5, user="u", item="i3", category="", ts_s=0, day=0, request=True,
                      first=False)  # fmt: skip
    pool = [f"i{k}" for k in range(50)]
    items, where = candidates(event, pool, n=10, seed=7, exclude=["i4"])
    assert items[where] == "i3" and items.count("i3") == 1 and "i4" not in items
    assert len(items) == len(set(items)) == 10
    assert candidates(event, pool, n=10, seed=7, exclude=["i4"]) == (items, where)


def test_hits_periods_and_the_later_half_gain() -> None:
    assert hit_at([0.9, 0.1, 0.5], 2, k=2) and not hit_at([0.9, 0.1, 0.5], 1, k=2)
    spans = periods(10, 4)
    assert [(s.start, s.stop) for s in spans] == [(0, 2), (2, 5), (5, 8), (8, 10)]
    frozen = period_figures([(0, True), (3, False), (6, False), (9, True), (9, False)], spans)
    loop = period_figures([(0, True), (3, False), (6, True), (9, True), (9, True)], spans)
    assert [f["requests"] for f in frozen] == [1, 1, 1, 2]
    assert later_half_gain(loop, frozen) == round((1 * 1.0 + 2 * 0.5) / 3, 5)


def test_unseen_items_are_counted_by_how_their_version_scored_them() -> None:
    vocabulary = {"v1": frozenset({"a", "b"})}
    records = [
        {"model_version": "v1", "items": ["a", "b"]},
        {"model_version": "v1", "items": ["a", "n1"], "cold_start": {"n1": ["Drama"]}},
        {"model_version": "v1", "items": ["n1", "n2"], "cold_start": {"n1": ["Drama"]}},
        {"model_version": "v1", "items": ["n3"], "degraded": True},
    ]
    got = unseen_scoring(records, vocabulary)
    assert got == {"requests": 3, "with_unseen_item": 2, "with_unseen_item_share": 0.66667,
                   "cold_start_share": 0.5}  # fmt: skip
