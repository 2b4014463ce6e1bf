"""A batch's side inputs as its version's feature spec defines them, from what the feature
store returned (pure: the Redis read happens in the service, in the sequences' round trip).

The raw values (counts, codes) go into the served log, so a record can be rescored exactly and
become a training sample; the model inputs come from them through the same transforms the
training code uses (:mod:`scoring.model.features`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scoring.model.features import (
    COUNTERS,
    FeatureSpec,
    action_codes,
    dense_counters,
    user_codes,
)
from scoring.model.side import SideArrays


@dataclass(frozen=True, slots=True)
class ServedFeatures:
    """One request's raw side feature values: the codes and the counts ``[C, F]`` per candidate
    (None where the spec has none)."""

    as_of_ms: int
    codes: list[int] | None = None
    counters: list[list[int]] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"as_of": self.as_of_ms}
        if self.codes is not None:
            out["codes"] = self.codes
        if self.counters is not None:
            out["counters"] = self.counters
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ServedFeatures:
        return cls(int(raw["as_of"]), raw.get("codes"), raw.get("counters"))

    def for_items(self, scored: Sequence[str], shown: Sequence[str]) -> ServedFeatures:
        """These features for ``shown`` (some of the ``scored`` items, which the counts are
        aligned with): what the served log keeps of a reply cut to its best items."""
        if self.counters is None:
            return self
        row = dict(zip(scored, self.counters, strict=True))
        return ServedFeatures(self.as_of_ms, self.codes, [row[item] for item in shown])


def counts_of(user: Any, items: Sequence[Any]) -> list[list[int]]:
    """Counts ``[C, F]`` in :data:`COUNTERS` order from a user's and its candidates' reads."""
    u1, u24, per = int(user.clicks_1h), int(user.clicks_24h), user.categories_24h
    return [
        [
            u1,
            u24,
            int(item.clicks_1h),
            int(item.clicks_24h),
            per.get(item.category, 0) if item.category else 0,
        ]
        for item in items
    ]


# The order counts_of writes: the order of COUNTERS (a change there must be made here too).
assert [c.name for c in COUNTERS] == [
    "user_clicks_1h", "user_clicks_24h", "item_clicks_1h", "item_clicks_24h",
    "user_category_clicks_24h",
]  # fmt: skip


def served_features(
    spec: FeatureSpec, as_of_ms: int, context: Mapping[str, Any] | None, read: Any | None
) -> ServedFeatures:
    """The raw side values of one request; ``read``: its features from the store (a
    ``streams.reader.RequestFeatures``), None when the spec reads nothing beyond the sequence."""
    codes = counters = None
    if spec.categorical:
        attributes = read.user.attributes if read is not None else None
        codes = user_codes(spec, as_of_ms, context, attributes)
    if spec.counters:
        if read is None:
            raise ValueError("a spec with counters needs the counters read")
        counters = counts_of(read.user, read.items)
    return ServedFeatures(as_of_ms, codes, counters)


def side_arrays(
    spec: FeatureSpec,
    served: Sequence[ServedFeatures],
    *,
    width: int,
    actions: Sequence[Sequence[str | None]] | None = None,
    hist_width: int = 0,
) -> SideArrays | None:
    """The model's side inputs of a batch: ``codes [B, P]``, ``dense [B, C, F]`` (candidate
    slots past a request's own are zero) and ``actions [B, L]`` (left-aligned like the history);
    None for a sequence-only spec."""
    if not spec.categorical and not spec.counters and not spec.actions:
        return None
    b = len(served)
    codes = dense = acts = None
    if spec.categorical:
        codes = np.asarray([s.codes for s in served], dtype=np.int64).reshape(b, -1)  # [B, P]
    if spec.counters:
        counts = np.zeros((b, width, len(COUNTERS)), dtype=np.int64)  # [B, C, F]
        for i, s in enumerate(served):
            rows = s.counters or []
            if rows:
                counts[i, : len(rows)] = rows
        dense = dense_counters(counts)  # [B, C, F]
    if spec.actions and actions is not None:
        acts = np.zeros((b, max(1, hist_width)), dtype=np.int64)  # [B, L]
        for i, row in enumerate(actions):
            codes_i = action_codes(spec, row[-acts.shape[1] :])
            acts[i, : len(codes_i)] = codes_i
    return SideArrays(codes=codes, dense=dense, actions=acts)
