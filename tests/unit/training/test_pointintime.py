"""Point in time, proven on generated logs: no feature of a sample sees its own event or anything
later, and the counts equal a brute-force count over the online window definition."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scoring.model.features import COUNTERS, FeatureSpec
from scoring.training.data import Dataset, _build, build_samples
from scoring.training.pointintime import LogIndex, counter_values, side_values
from streamrank.errors import ConfigError
from streams.windows import Window, closed_range

WINDOWS = {"1h": Window("1h", 3600, 300), "24h": Window("24h", 86400, 3600)}
SPEC = FeatureSpec(
    families=("sequence", "counters", "context"),
    windows={"1h": 300, "24h": 3600},
)


@st.composite
def logs(draw: st.DrawFn) -> Dataset:
    n = draw(st.integers(20, 120))
    users = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=n, max_size=n))
    items = draw(st.lists(st.sampled_from([str(i) for i in range(30)]), min_size=n, max_size=n))
    # seconds within two days, with many ties (the same second happens often in real logs)
    ts = draw(st.lists(st.integers(1_700_000_000, 1_700_000_000 + 2 * 86400), min_size=n,
                       max_size=n).map(sorted))  # fmt: skip
    genres = {str(i): [f"g{i % 3}", *(["x"] if i % 4 == 0 else [])] for i in range(30)}
    return _build("gen", users, items, ts, genres, "sha", {})


def _subset(ds: Dataset, keep: np.ndarray) -> Dataset:
    return dataclasses.replace(
        ds, user_ids=ds.user_ids[keep], item_index=ds.item_index[keep], ts=ds.ts[keep]
    )


@settings(max_examples=40, deadline=None)
@given(logs())
def test_features_never_see_the_sample_time_or_later(ds: Dataset) -> None:
    try:
        split = build_samples(ds, history_len=5, n_negatives=2, seed=1)
    except ConfigError:  # a user rated every item: no negatives to draw
        assume(False)
        return
    samples = split.train if len(split.train) else split.test
    if len(samples) == 0:
        return
    counts = counter_values(LogIndex.build(ds), samples, WINDOWS)
    side, _ = side_values(ds, samples, SPEC, windows=WINDOWS)
    ts_ms = ds.ts * 1000
    for k in range(0, len(samples), max(1, len(samples) // 8)):
        as_of = int(samples.ts[k])
        # history: only events strictly before the sample time
        rows = samples.hist_rows[k][samples.hist_mask[k]]
        assert (ts_ms[rows] < as_of).all()
        # the same sample's features from the log cut at its time: nothing later mattered
        past = _subset(ds, ts_ms < as_of)
        one = dataclasses.replace(
            samples, **{f: getattr(samples, f)[k : k + 1] for f in ("user", "hist", "hist_mask",
                                                                   "hist_rows", "cand", "label",
                                                                   "ts")}
        )  # fmt: skip
        if past.n_events:
            again = counter_values(LogIndex.build(past), one, WINDOWS)
            np.testing.assert_array_equal(again[0], counts[k])
        else:
            assert not counts[k].any()
        _brute_force(ds, samples.user[k], samples.cand[k], as_of, counts[k])
    # context: hour of day and weekday of the sample time, nothing else
    hours = (samples.ts // 1000 // 3600) % 24
    assert (side.codes[:, 0] == hours).all()  # type: ignore[index]


def _brute_force(ds: Dataset, user: str, cand: np.ndarray, as_of: int, got: np.ndarray) -> None:
    """Counts by the definition: events with bucket start in the closed range of each window."""
    cands = np.atleast_1d(cand)
    category = [ds.item_category(int(i)) for i in range(len(ds.items))]
    for c_pos, item in enumerate(cands.tolist()):
        want = []
        for counter in COUNTERS:
            lo, hi = closed_range(as_of, WINDOWS[counter.window])
            inside = (ds.ts >= lo) & (ds.ts < hi)
            if counter.entity == "user":
                hit = inside & (ds.user_ids == user)
            elif counter.entity == "item":
                hit = inside & (ds.item_index == item)
            else:
                same = np.array([category[i] == category[item] for i in ds.item_index.tolist()])
                hit = inside & (ds.user_ids == user) & same
            want.append(int(hit.sum()))
        row = got if got.ndim == 1 else got[c_pos]
        assert row.tolist() == want, (counter, row, want)
