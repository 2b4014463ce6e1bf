"""The train negatives: the mix's shape, determinism, never a clicked item, never the future,
and the popularity source's distribution."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scoring.training.data import Dataset, Samples, build_samples
from scoring.training.negatives import Allowed, NegativeMix, popularity, with_negatives
from scoring.training.synthetic import generate
from scoring.training.timesplit import build_time_split
from scoring.training.twotower import RetrievalConfig, train_retriever
from streamrank.errors import ConfigError
from tests.unit.training.test_timesplit import _check_samples, _dataset


def test_mix_parses_and_refuses_bad_text() -> None:
    mix = NegativeMix.parse("uniform:1, popularity:2,hard", alpha=0.5)
    assert (mix.uniform, mix.popularity, mix.hard, mix.total, mix.alpha) == (1, 2, 1, 4, 0.5)
    assert mix.text() == "uniform:1,popularity:2,hard:1"
    for bad in ("uniform:x", "random:1", "hard:1,hard:2", "uniform:0", "uniform:-1,hard:2"):
        with pytest.raises(ConfigError):
            NegativeMix.parse(bad)


@pytest.fixture(scope="module")
def synthetic() -> Dataset:
    return generate(n_users=60, n_items=400, events_per_user=(8, 20), seed=5)


def _groups(train: Samples, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Positives ``[P]`` and negatives ``[P, k]`` of ``[pos, neg_1..neg_k]`` groups."""
    assert len(train) % (k + 1) == 0
    cand = train.cand.reshape(-1, k + 1)
    labels = train.label.reshape(-1, k + 1)
    assert (labels[:, 0] == 1).all() and (labels[:, 1:] == 0).all()
    for field in ("user", "ts", "hist", "hist_mask", "hist_rows"):
        rows = getattr(train, field).reshape(len(cand), k + 1, *getattr(train, field).shape[1:])
        assert (rows == rows[:, :1]).all(), f"{field} differs inside a group"
    return cand[:, 0], cand[:, 1:]


def test_leave_last_out_mix_is_grouped_seeded_and_never_a_rated_item(synthetic: Dataset) -> None:
    split = build_samples(synthetic, history_len=10, n_negatives=5, seed=3)
    towers = train_retriever(synthetic, split.train, split.train_item_counts,
                             RetrievalConfig(epochs=1), seed=3)  # fmt: skip
    mix = NegativeMix.parse("uniform:2,popularity:2,hard:2", hard_top=20)
    train = with_negatives(synthetic, split.train, mix, seed=3, before_ms=None, retriever=towers[0])
    pos, negs = _groups(train, 6)
    assert pos.tolist() == split.train.cand[0::2].tolist()  # the same positives, in order
    assert negs[:, 0].tolist() == split.train.cand[1::2].tolist()  # the split's own negative
    users = train.user[0 :: mix.total + 1]
    for user, row in zip(users.tolist(), negs, strict=True):
        rated = set(synthetic.item_index[synthetic.user_ids == user].tolist())
        assert not rated & set(row.tolist())
    again = with_negatives(synthetic, split.train, mix, seed=3, before_ms=None, retriever=towers[0])
    other = with_negatives(synthetic, split.train, mix, seed=4, before_ms=None, retriever=towers[0])
    assert (again.cand == train.cand).all() and not (other.cand == train.cand).all()
    # hard negatives are among the retriever's best 20 allowed items of the sample's history
    r = 7
    history = [synthetic.items[i] for i in train.hist[r * 7][train.hist_mask[r * 7]].tolist()]
    scores = towers[0].user_vectors([history])[0] @ towers[0].vectors.T
    allowed = Allowed(synthetic, Samples(*(getattr(train, f)[r * 7 : r * 7 + 1]
                                           for f in Samples.__dataclass_fields__)), before_ms=None)  # fmt: skip
    scores = np.where(allowed.mask(np.zeros(1, dtype=np.int64))[0], scores, -np.inf)
    assert set(negs[r, 4:].tolist()) <= set(np.argsort(-scores)[:20].tolist())


def test_uniform_one_is_the_split_as_built(synthetic: Dataset) -> None:
    split = build_samples(synthetic, history_len=10, n_negatives=5, seed=3)
    same = with_negatives(synthetic, split.train, NegativeMix(popularity=0), seed=3, before_ms=None)
    assert same is split.train
    with pytest.raises(ConfigError, match="retrieval"):
        with_negatives(synthetic, split.train, NegativeMix.parse("hard:1"), seed=3, before_ms=None)


def test_popularity_draws_follow_counts_before_the_sample(synthetic: Dataset) -> None:
    split = build_time_split(synthetic, history_len=10, n_negatives=5, seed=3)
    positives = Samples(*(getattr(split.train, f)[0::2] for f in Samples.__dataclass_fields__))
    allowed = Allowed(synthetic, positives, before_ms=split.cutoff_ms)
    r = int(np.argsort(positives.ts)[len(positives) // 2])  # a sample in the middle of time
    draws = popularity(np.random.default_rng(0), allowed, np.full(40_000, r), positives, 0.75)
    before = positives.ts < positives.ts[r]
    counts = np.bincount(positives.cand[before], minlength=len(synthetic.items)).astype(float)
    expected = counts**0.75 * allowed.mask(np.array([r]))[0]
    expected /= expected.sum()
    seen = np.bincount(draws, minlength=len(synthetic.items)) / len(draws)
    assert seen[expected == 0].sum() == 0  # never an item without a train click before then
    assert np.abs(seen - expected).max() < 0.01


events = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 14), st.integers(0, 30)), min_size=1, max_size=80
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=events,
    quantile=st.floats(0.05, 0.95),
    uniform=st.integers(0, 2),
    popular=st.integers(0, 3),
    seed=st.integers(0, 3),
)
def test_time_split_negatives_never_peek(
    events: list[tuple[int, int, int]], quantile: float, uniform: int, popular: int, seed: int
) -> None:
    ds = _dataset(events)
    split = build_time_split(ds, history_len=3, n_negatives=0, seed=seed, cutoff_quantile=quantile)
    if uniform + popular == 0 or len(split.train) == 0:
        return
    mix = NegativeMix(uniform=uniform, popularity=popular)
    train = with_negatives(ds, split.train, mix, seed=seed, before_ms=split.cutoff_ms)
    _, negs = _groups(train, mix.total)
    _check_samples(ds, train, pairs=True, cutoff=split.cutoff_ms, name="train")
    users = train.user[0 :: mix.total + 1]
    ts_ms = ds.ts * 1000
    for user, row in zip(users.tolist(), negs, strict=True):  # not clicked before the cutoff
        mine = (ds.user_ids == user) & (ts_ms < split.cutoff_ms)
        assert not set(ds.item_index[mine].tolist()) & set(row.tolist())
    again = with_negatives(ds, split.train, mix, seed=seed, before_ms=split.cutoff_ms)
    assert (again.cand == train.cand).all()
