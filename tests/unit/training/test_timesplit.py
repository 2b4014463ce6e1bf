"""The time-split protocol cannot peek: histories, negatives and items all come from the past."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scoring.training.data import Dataset, Samples, _build
from scoring.training.timesplit import TimeSplit, build_time_split, cutoff_at_quantile
from streamrank.errors import ConfigError


def _dataset(events: list[tuple[int, int, int]]) -> Dataset:
    """Events ``(user, item, ts seconds)`` in file order."""
    users = [f"u{u}" for u, _, _ in events]
    items = [f"i{i}" for _, i, _ in events]
    return _build("test", users, items, [t for _, _, t in events], {}, "sha", {})


def _first_seen_ms(ds: Dataset) -> np.ndarray:
    first = np.full(len(ds.items), np.iinfo(np.int64).max)
    np.minimum.at(first, ds.item_index, ds.ts * 1000)
    return first


def _check_samples(ds: Dataset, samples: Samples, *, pairs: bool, cutoff: int, name: str) -> None:
    """Every history event, every negative and the positive obey the point-in-time rule."""
    first_ms = _first_seen_ms(ds)
    ts_ms = ds.ts * 1000
    rows = np.arange(ds.n_events)
    for s in range(len(samples)):
        at, user = int(samples.ts[s]), str(samples.user[s])
        mine = rows[ds.user_ids == user]
        known = mine[ts_ms[mine] < at]  # the user's events strictly before the sample
        hist = samples.hist_rows[s][samples.hist_mask[s]]
        assert (ts_ms[hist] < at).all() and set(hist.tolist()) <= set(known.tolist())
        # the history is the latest events before the sample time, oldest first
        latest = sorted(known.tolist(), key=lambda r: (ts_ms[r], r))[-samples.hist.shape[1] :]
        assert hist.tolist() == latest
        assert samples.hist[s][samples.hist_mask[s]].tolist() == ds.item_index[hist].tolist()
        cands = np.atleast_1d(samples.cand[s])
        labels = np.atleast_1d(samples.label[s])
        clicked_before = set(ds.item_index[known].tolist())
        for item in cands[labels == 0].tolist():
            assert first_ms[item] < at, f"{name}: negative {item} appears only at or after {at}"
            assert item not in clicked_before, f"{name}: negative {item} was clicked before"
        if not pairs:  # evaluation rows: positive first, then distinct negatives
            assert (
                labels[0] == 1 and labels[1:].sum() == 0 and len(set(cands.tolist())) == len(cands)
            )
        for pos in cands[labels == 1].tolist():  # the positive is this user's click at that time
            assert ((ds.item_index[mine] == pos) & (ts_ms[mine] == at)).any()
        assert (at >= cutoff) if name == "test" else (at < cutoff)


def _check_split(ds: Dataset, split: TimeSplit) -> None:
    for name in ("train", "valid", "test"):
        samples = getattr(split, name)
        _check_samples(ds, samples, pairs=name == "train", cutoff=split.cutoff_ms, name=name)
    # the test positive is each user's first click at or after the cutoff
    ts_ms = ds.ts * 1000
    for user, at in zip(split.test.user.tolist(), split.test.ts.tolist(), strict=True):
        assert at == ts_ms[(ds.user_ids == user) & (ts_ms >= split.cutoff_ms)].min()
    c = split.counts
    test_fates = ("test_users", "skipped_no_test_event", "skipped_test_empty_history",
                  "skipped_test_too_few_items")  # fmt: skip
    assert sum(c.get(k, 0) for k in test_fates) == c["users"] == len(set(ds.user_ids.tolist()))
    assert c["train_samples"] * 2 == len(split.train) and c["test_users"] == len(split.test)


events = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 14), st.integers(0, 30)), min_size=1, max_size=80
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=events,
    quantile=st.floats(0.05, 0.95),
    history_len=st.integers(1, 6),
    n_negatives=st.integers(0, 4),
    seed=st.integers(0, 3),
)
def test_time_split_never_peeks(
    events: list[tuple[int, int, int]],
    quantile: float,
    history_len: int,
    n_negatives: int,
    seed: int,
) -> None:
    ds = _dataset(events)
    split = build_time_split(
        ds, history_len=history_len, n_negatives=n_negatives, seed=seed, cutoff_quantile=quantile
    )
    assert split.cutoff_ms == cutoff_at_quantile(ds, quantile)
    _check_split(ds, split)
    again = build_time_split(
        ds, history_len=history_len, n_negatives=n_negatives, seed=seed, cutoff_quantile=quantile
    )
    for name in ("train", "valid", "test"):  # deterministic for a seed
        np.testing.assert_array_equal(getattr(split, name).cand, getattr(again, name).cand)
    np.testing.assert_array_equal(split.train_item_counts, again.train_item_counts)


def test_time_split_on_a_small_log() -> None:
    # user 0 clicks items 0..4 at 1..5 s; cutoff 4 s. Items 7, 8 exist from 0 s; item 9 appears
    # at 6 s (by user 1), after user 0's test time 4 s, so it may never be one of its negatives.
    log = [(1, 7, 0), (1, 8, 0)] + [(0, i, i + 1) for i in range(5)] + [(1, 9, 6), (1, 0, 7)]
    ds = _dataset(log)
    idx = {item: n for n, item in enumerate(ds.items)}
    split = build_time_split(ds, history_len=2, n_negatives=2, seed=1, cutoff_ms=4000)
    _check_split(ds, split)
    train_pos = split.train.cand[(split.train.user == "u0") & (split.train.label == 1)]
    assert train_pos.tolist() == [idx["i1"]]  # positions 1 .. m-2 (m = 3 events before 4 s)
    v = int(np.flatnonzero(split.valid.user == "u0")[0])
    assert split.valid.cand[v, 0] == idx["i2"] and split.valid.ts[v] == 3000
    t = int(np.flatnonzero(split.test.user == "u0")[0])
    assert split.test.cand[t, 0] == idx["i3"] and split.test.ts[t] == 4000
    assert split.test.hist[t].tolist() == [idx["i1"], idx["i2"]]  # the latest 2 before 4 s
    # the only items that existed before 4 s and that user 0 had not clicked: 7 and 8
    assert sorted(split.test.cand[t, 1:].tolist()) == [idx["i7"], idx["i8"]]
    # user 1: 2 events before the cutoff (validation at 0 s has no history), test at 6 s
    assert split.counts["valid_users"] == 1 and split.counts["test_users"] == 2
    assert split.counts["skipped_valid_empty_history"] == 1
    # popularity: events before the cutoff, without the validation positives
    assert split.train_item_counts.sum() == 5 - 1
    with pytest.raises(ConfigError, match="strictly between 0 and 1"):
        build_time_split(ds, cutoff_quantile=1.0)
