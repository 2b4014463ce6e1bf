"""Point-in-time feature values of training samples: each sample's features from the events
strictly before its time, with the window arithmetic the online reads use.

A sample's counters count the log's events inside :func:`streams.windows.closed_range` of the
sample's time: whole buckets that closed at or before it, so neither the sample's own event nor
anything later is ever counted. Its context is its time's hour and weekday; its attributes are
the user's. The raw values go through the transforms of :mod:`scoring.model.features`, the same
ones the scoring worker applies to what it reads from Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from scoring.model.features import (
    COUNTERS,
    FeatureSpec,
    attribute_codes,
    context_key_codes,
    dense_counters,
    time_codes,
)
from scoring.model.side import SideArrays
from scoring.training.data import Dataset, Samples
from streams.windows import Window, closed_range

IntArray = npt.NDArray[np.int64]


class EventCounts:
    """Counts the events of one key inside ``[lo_ms, hi_ms)``, vectorised (sorted composite keys
    and two binary searches per query)."""

    def __init__(self, keys: IntArray, ts_ms: IntArray) -> None:
        self._t0 = int(ts_ms.min(initial=0))
        self._span = int(ts_ms.max(initial=0)) - self._t0 + 2
        if int(keys.max(initial=0)) + 1 >= 2**62 // self._span:
            raise ValueError("too many keys for the log's time span to index")
        self._sorted = np.sort(keys * self._span + (ts_ms - self._t0))

    def count(self, keys: IntArray, lo_ms: IntArray, hi_ms: IntArray) -> IntArray:
        """Events of ``keys[i]`` with ``lo_ms[i] <= ts < hi_ms[i]`` (arrays broadcast)."""
        lo = np.clip(np.asarray(lo_ms) - self._t0, 0, self._span - 1)
        hi = np.clip(np.asarray(hi_ms) - self._t0, 0, self._span - 1)
        base = np.asarray(keys, dtype=np.int64) * self._span
        found_hi = np.searchsorted(self._sorted, base + hi, side="left")
        found_lo = np.searchsorted(self._sorted, base + lo, side="left")
        return (found_hi - found_lo).astype(np.int64)


@dataclass(frozen=True)
class LogIndex:
    """The log indexed for point-in-time counts by user, item and (user, category string)."""

    users: npt.NDArray[np.str_]  # sorted distinct user ids
    item_category: IntArray  # [n_items] code of each item's category string
    n_categories: int
    by_user: EventCounts
    by_item: EventCounts
    by_user_category: EventCounts

    @classmethod
    def build(cls, ds: Dataset) -> LogIndex:
        users, user_code = np.unique(ds.user_ids, return_inverse=True)
        strings = [ds.item_category(i) for i in range(len(ds.items))]
        _, item_category = np.unique(np.asarray(strings, dtype=np.str_), return_inverse=True)
        item_category = item_category.astype(np.int64)
        n_cat = int(item_category.max(initial=0)) + 1
        ts_ms = ds.ts.astype(np.int64) * 1000
        user_code = user_code.astype(np.int64)
        return cls(
            users=users,
            item_category=item_category,
            n_categories=n_cat,
            by_user=EventCounts(user_code, ts_ms),
            by_item=EventCounts(ds.item_index.astype(np.int64), ts_ms),
            by_user_category=EventCounts(user_code * n_cat + item_category[ds.item_index], ts_ms),
        )

    def user_code(self, user_ids: npt.NDArray[np.str_]) -> IntArray:
        """Each user's code; -1 (no events, every count 0) for a user the log does not hold."""
        if len(self.users) == 0:
            return np.full(len(user_ids), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.users, user_ids), len(self.users) - 1)
        return np.where(self.users[pos] == user_ids, pos, -1).astype(np.int64)


def _range(as_of_ms: IntArray, window: Window) -> tuple[IntArray, IntArray]:
    """:func:`closed_range` over many times, in epoch ms."""
    lo, hi = closed_range(as_of_ms, window)  # type: ignore[arg-type]  # elementwise on arrays
    return np.asarray(lo) * 1000, np.asarray(hi) * 1000


def counter_values(
    index: LogIndex, samples: Samples, windows: dict[str, Window]
) -> npt.NDArray[np.int64]:
    """Raw counts ``[n, F]`` (one candidate per sample) or ``[n, C, F]``, in :data:`COUNTERS`
    order."""
    cand = samples.cand  # [n] or [n, C]
    shape = cand.shape
    as_of = samples.ts.reshape(-1, *([1] * (cand.ndim - 1)))  # [n] or [n, 1]
    user = index.user_code(samples.user).reshape(as_of.shape)
    out = np.zeros((*shape, len(COUNTERS)), dtype=np.int64)
    for f, counter in enumerate(COUNTERS):
        lo, hi = _range(as_of, windows[counter.window])
        if counter.entity == "user":
            values = index.by_user.count(user, lo, hi)
        elif counter.entity == "item":
            values = index.by_item.count(cand, lo, hi)
        else:
            key = np.where(user >= 0, user * index.n_categories + index.item_category[cand], -1)
            values = index.by_user_category.count(key, lo, hi)
        out[..., f] = np.broadcast_to(values, shape)
    return out


def side_values(
    ds: Dataset,
    samples: Samples,
    spec: FeatureSpec,
    *,
    windows: dict[str, Window],
    index: LogIndex | None = None,
) -> tuple[SideArrays, dict[str, Any]]:
    """The samples' side inputs as the model takes them, and their raw values (counts, codes)."""
    raw: dict[str, Any] = {}
    dense = codes = None
    if spec.has("counters"):
        raw["counters"] = counter_values(index or LogIndex.build(ds), samples, windows)
        dense = dense_counters(raw["counters"])
    if spec.categorical:
        codes = categorical_values(ds, samples, spec)
        raw["codes"] = codes
    return SideArrays(codes=codes, dense=dense, actions=None), raw


def categorical_values(ds: Dataset, samples: Samples, spec: FeatureSpec) -> IntArray:
    """``[n, P]`` codes in :attr:`FeatureSpec.categorical` order (the logs carry no request
    context, so declared context keys take their absent-value code)."""
    parts: list[IntArray] = []
    n = len(samples)
    if spec.has("context"):
        parts.append(time_codes(samples.ts))
        keys = context_key_codes(spec, None)
        parts.append(np.tile(np.asarray(keys, dtype=np.int64), (n, 1)).reshape(n, len(keys)))
    if spec.has("attributes"):
        users, inverse = np.unique(samples.user, return_inverse=True)
        table = [attribute_codes(spec, ds.users.get(str(u))) for u in users.tolist()]
        width = len(spec.user_attributes)
        parts.append(np.asarray(table, dtype=np.int64).reshape(len(users), width)[inverse])
    return np.concatenate(parts, axis=1) if parts else np.zeros((n, 0), dtype=np.int64)
