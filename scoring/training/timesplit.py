"""Time-split samples: learn from the past, test on what each user does next after a cutoff.

Point in time is the rule everywhere: a sample at time ``t`` (epoch ms) knows only events with
``ts < t`` (same-second events are not known), and the items that exist for it are those that
appeared in the log strictly before ``t``. Per user, in ``(ts, event_id)`` order:

* **train**: every event strictly before the cutoff except the user's first and last one is a
  positive, with the user's latest ``<= history_len`` events strictly before it as history, plus
  one negative drawn (seeded) from the items that existed before the sample's time and that the
  user did not click before the cutoff. A train sample whose time has no such item is dropped.
* **validation**: the user's last event before the cutoff (the slice of the log just before the
  test time that the models never train on), with ``n_negatives`` distinct negatives.
* **test**: the user's FIRST event at or after the cutoff, history = the user's events strictly
  before it, plus ``n_negatives`` distinct negatives drawn from the items that existed strictly
  before that time and that the user had not clicked up to then (nothing after the sample's time
  is read: not the future clicks of the user, not items that appear later).

Validation and test samples with an empty history are skipped, like users with no event at or
after the cutoff; :attr:`TimeSplit.counts` says how many. Popularity counts every event before
the cutoff except the validation positives (what the models train on).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scoring.training.data import (
    Dataset,
    IntArray,
    Samples,
    Split,
    _stack_eval,
    _stack_train,
    chronological_order,
)
from streamrank.errors import ConfigError

_REJECTION_ROUNDS = 16  # draws before falling back to the explicit pool of allowed items


@dataclass(frozen=True)
class TimeSplit(Split):
    """A :class:`Split` plus the cutoff it was cut at and what was skipped."""

    cutoff_ms: int
    counts: dict[str, int]  # users, train, valid and test samples, and the skipped ones


def cutoff_at_quantile(ds: Dataset, quantile: float) -> int:
    """The event time (epoch ms) at the ``quantile`` of all event times."""
    if not 0.0 < quantile < 1.0:
        raise ConfigError(f"cutoff quantile {quantile} must lie strictly between 0 and 1")
    return int(np.quantile(ds.ts, quantile, method="higher")) * 1000


class _ItemsByAge:
    """Items ordered by their first appearance in the log: which existed before a time."""

    def __init__(self, ds: Dataset) -> None:
        first = np.full(len(ds.items), np.iinfo(np.int64).max, dtype=np.int64)  # [n_items]
        np.minimum.at(first, ds.item_index, ds.ts * 1000)
        self.order = np.argsort(first, kind="stable")  # [n_items] oldest first
        self.first_ms = first[self.order]  # [n_items] ascending

    def existing(self, t_ms: IntArray) -> IntArray:
        """How many items appeared strictly before each time: ``order[:k]`` are they."""
        return np.searchsorted(self.first_ms, t_ms, side="left")


def _one_negative_each(
    rng: np.random.Generator, items: _ItemsByAge, k: IntArray, exclude: IntArray
) -> IntArray:
    """One item per sample from ``items.order[:k[s]]`` not in ``exclude`` (sorted); -1 if none."""
    out = np.full(len(k), -1, dtype=np.int64)  # [S]
    todo = np.flatnonzero(k > 0)
    for _ in range(_REJECTION_ROUNDS):
        if len(todo) == 0:
            return out
        draw = items.order[(rng.random(len(todo)) * k[todo]).astype(np.int64)]  # [T]
        ok = ~np.isin(draw, exclude, assume_unique=False)
        out[todo[ok]] = draw[ok]
        todo = todo[~ok]
    for s in todo.tolist():  # few allowed items: draw from the explicit pool
        pool = np.setdiff1d(items.order[: k[s]], exclude)
        if len(pool):
            out[s] = pool[rng.integers(len(pool))]
    return out


def _distinct_negatives(
    rng: np.random.Generator, items: _ItemsByAge, k: int, exclude: IntArray, count: int
) -> IntArray | None:
    """``count`` distinct items of ``items.order[:k]`` not in ``exclude``; None if too few."""
    if k >= 4 * (len(exclude) + count):  # mostly allowed: rejection sampling
        out: list[int] = []
        taken = set(exclude.tolist())
        while len(out) < count:
            for item in items.order[rng.integers(0, k, size=2 * count + 8)].tolist():
                if item not in taken:
                    taken.add(item)
                    out.append(item)
                    if len(out) == count:
                        break
        return np.asarray(out, dtype=np.int64)
    pool = np.setdiff1d(items.order[:k], exclude)
    if len(pool) < count:
        return None
    return rng.choice(pool, size=count, replace=False).astype(np.int64)


def _history(
    times: IntArray, pos: IntArray, history_len: int
) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """Indices ``[P, L]`` into the user's events of each position's history, and the mask."""
    end = np.searchsorted(times, times[pos], side="left")  # [P] first event not before
    lo = np.maximum(end - history_len, 0)
    idx = lo[:, None] + np.arange(history_len)[None, :]  # [P, L]
    return idx, idx < end[:, None]


def _eval_sample(
    rng: np.random.Generator,
    items: _ItemsByAge,
    user: str,
    at: int,
    user_rows: tuple[IntArray, IntArray, IntArray, npt.NDArray[np.bool_], IntArray],
    n_negatives: int,
) -> tuple | str:
    """The evaluation sample at the user's event ``at``, or why there is none."""
    seq, times, hist, mask, hist_rows = user_rows
    if not mask[at].any():
        return "empty_history"
    known = np.unique(seq[times <= times[at]])  # clicked by then, the positive included
    k = int(items.existing(times[at : at + 1])[0])
    neg = _distinct_negatives(rng, items, k, known, n_negatives)
    if neg is None:
        return "too_few_items"
    one = slice(at, at + 1)
    return (user, hist[one], mask[one], hist_rows[one], np.r_[seq[at], neg], times[one])


def build_time_split(
    ds: Dataset,
    *,
    history_len: int = 50,
    n_negatives: int = 20,
    seed: int = 17,
    cutoff_ms: int | None = None,
    cutoff_quantile: float = 0.8,
) -> TimeSplit:
    """Time-split samples (see the module docstring); deterministic for a given seed.

    ``cutoff_ms`` defaults to the ``cutoff_quantile`` of the event times.
    """
    cutoff = cutoff_at_quantile(ds, cutoff_quantile) if cutoff_ms is None else int(cutoff_ms)
    rng = np.random.default_rng(seed)
    items = _ItemsByAge(ds)
    order = chronological_order(ds)
    users_sorted = ds.user_ids[order]
    starts = np.flatnonzero(np.r_[True, users_sorted[1:] != users_sorted[:-1]])
    ends = np.r_[starts[1:], len(order)]
    parts: dict[str, list] = {k: [] for k in ("train", "valid", "test")}
    counts = np.zeros(len(ds.items), dtype=np.int64)
    skipped: dict[str, int] = {}
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        rows = order[s:e]  # this user's events, chronological
        user, seq, times = str(users_sorted[s]), ds.item_index[rows], ds.ts[rows] * 1000
        m = int(np.searchsorted(times, cutoff, side="left"))  # events before the cutoff
        idx, mask = _history(times, np.arange(len(rows)), history_len)  # [n, L]
        clipped = np.minimum(idx, len(rows) - 1)
        user_rows = (seq, times, np.where(mask, seq[clipped], 0), mask,
                     np.where(mask, rows[clipped], -1))  # fmt: skip
        counts += np.bincount(seq[:m], minlength=len(ds.items))
        if m >= 3:  # train positions 1 .. m-2
            p = np.arange(1, m - 1)
            neg = _one_negative_each(rng, items, items.existing(times[p]), np.unique(seq[:m]))
            skipped["train_no_negative"] = skipped.get("train_no_negative", 0) + int(
                (neg < 0).sum()
            )
            p, neg = p[neg >= 0], neg[neg >= 0]
            parts["train"].append((user, user_rows[2][p], mask[p], user_rows[4][p], seq[p], neg,
                                   times[p]))  # fmt: skip
        for name, at in (("valid", m - 1), ("test", m)):
            if name == "test" and at == len(rows):
                reason = "no_test_event"
            elif name == "valid" and at < 1:
                reason = "valid_none"  # fewer than two events before the cutoff
            else:
                sample = _eval_sample(rng, items, user, at, user_rows, n_negatives)
                if not isinstance(sample, str):
                    parts[name].append(sample)
                    counts[seq[at]] -= name == "valid"  # held out of training
                    continue
                reason = f"{name}_{sample}"
            skipped[reason] = skipped.get(reason, 0) + 1
    return TimeSplit(
        train=_stack_or_empty(parts["train"], history_len, None),
        valid=_stack_or_empty(parts["valid"], history_len, n_negatives),
        test=_stack_or_empty(parts["test"], history_len, n_negatives),
        train_item_counts=counts,
        cutoff_ms=cutoff,
        counts={
            "users": len(starts),
            "train_samples": sum(len(p[4]) for p in parts["train"]),
            "valid_users": len(parts["valid"]),
            "test_users": len(parts["test"]),
            **{f"skipped_{k}": v for k, v in sorted(skipped.items())},
        },
    )


def _stack_or_empty(parts: list, history_len: int, n_negatives: int | None) -> Samples:
    """Stacked samples (train pairs when ``n_negatives`` is None), or empty ones of that shape."""
    if parts:
        if n_negatives is None:
            return _stack_train(parts, history_len)
        return _stack_eval(parts, history_len, n_negatives)
    shape = (0,) if n_negatives is None else (0, 1 + n_negatives)
    return Samples(
        user=np.zeros(0, dtype=np.str_),
        hist=np.zeros((0, history_len), dtype=np.int64),
        hist_mask=np.zeros((0, history_len), dtype=bool),
        hist_rows=np.zeros((0, history_len), dtype=np.int64),
        cand=np.zeros(shape, dtype=np.int64),
        label=np.zeros(shape, dtype=np.float32),
        ts=np.zeros(0, dtype=np.int64),
    )
