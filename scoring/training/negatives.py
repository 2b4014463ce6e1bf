"""The negatives DIN trains against: ``k`` per train positive, from a mix of three sources.

* ``uniform``: any item the user never clicked (leave-last-out: never rated; time split: not
  clicked before the cutoff and seen in the log before the sample's time). The first one is the
  negative the split already drew, so ``uniform:1`` is the split as built.
* ``popularity``: drawn with probability ``∝ c(t)^alpha``, ``c(t)`` = the item's train positives
  strictly before the sample's time ``t`` (point in time: an item with none then is never
  drawn), by rejection from the final train counts.
* ``hard``: drawn uniformly from the retriever's best ``hard_top`` allowed items for the sample's
  history (the candidates a cascade hands the ranker), the retriever trained on the same train
  samples.

Every negative obeys the uniform source's rule (never a clicked item, never one unseen before
``t`` in the time split); a popularity draw that keeps being rejected falls back to a uniform
one. The train samples come back grouped per positive: ``[pos, neg_1 .. neg_k]``, in the
split's positive order. Deterministic for a seed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from scoring.model.retrieval import Retriever
from scoring.training.data import Dataset, IntArray, Samples, Split
from scoring.training.fullrank import TrainedRetriever
from scoring.training.pointintime import EventCounts
from scoring.training.twotower import RetrievalConfig, train_retriever
from streamrank.errors import ConfigError

SOURCES = ("uniform", "popularity", "hard")
_ROUNDS = 32  # rejection rounds before a fallback
_CHUNK = 4096  # samples per retriever scoring chunk


@dataclass(frozen=True)
class NegativeMix:
    """How many negatives of each source per train positive, and the sources' parameters."""

    uniform: int = 1
    popularity: int = 0
    hard: int = 0
    alpha: float = 0.75  # popularity exponent
    hard_top: int = 200  # hard negatives come from the retriever's best this many

    def __post_init__(self) -> None:
        if min(self.uniform, self.popularity, self.hard) < 0 or self.total < 1:
            raise ConfigError(f"negative mix {self.text()!r}: counts must be >= 0, total >= 1")
        if self.hard and self.hard_top < 1:
            raise ConfigError(f"hard_top {self.hard_top} must be >= 1")

    @property
    def total(self) -> int:
        return self.uniform + self.popularity + self.hard

    def text(self) -> str:
        return ",".join(f"{s}:{getattr(self, s)}" for s in SOURCES if getattr(self, s))

    @classmethod
    def parse(cls, text: str, **params: Any) -> NegativeMix:
        """``"uniform:1,popularity:2,hard:2"`` (a source without a count means 1)."""
        counts: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, count = part.partition(":")
            if name not in SOURCES or name in counts:
                raise ConfigError(
                    f"negative source {name!r} in {text!r}: expected each of {', '.join(SOURCES)} "
                    "at most once, as source:count"
                )
            try:
                counts[name] = int(count) if count else 1
            except ValueError as exc:
                raise ConfigError(
                    f"negative count {count!r} in {text!r} is not an integer"
                ) from exc
        return cls(**{s: counts.get(s, 0) for s in SOURCES}, **params)

    def to_json(self) -> dict[str, Any]:
        return {"mix": self.text(), "per_positive": self.total, "alpha": self.alpha,
                "hard_top": self.hard_top}  # fmt: skip


class Allowed:
    """Which items a train sample may take as a negative: not clicked by its user (as the split
    defines it) and, in the time split, seen in the log strictly before the sample's time."""

    def __init__(self, ds: Dataset, samples: Samples, *, before_ms: int | None) -> None:
        self.n_items = len(ds.items)
        users, codes = np.unique(ds.user_ids, return_inverse=True)
        clicked = (
            np.ones(ds.n_events, dtype=bool) if before_ms is None else ds.ts * 1000 < before_ms
        )
        self._seen = np.unique(codes[clicked] * self.n_items + ds.item_index[clicked])  # sorted
        self.user = np.searchsorted(users, samples.user)  # [S] user codes
        if before_ms is None:  # leave-last-out: every item exists
            self.order = np.arange(self.n_items, dtype=np.int64)
            self.k = np.full(len(samples), self.n_items, dtype=np.int64)
        else:
            first = np.full(self.n_items, np.iinfo(np.int64).max, dtype=np.int64)
            np.minimum.at(first, ds.item_index, ds.ts * 1000)
            self.order = np.argsort(first, kind="stable")  # oldest first
            self.k = np.searchsorted(first[self.order], samples.ts, side="left")  # [S]
        self._rank = np.empty(self.n_items, dtype=np.int64)  # [N] position in ``order``
        self._rank[self.order] = np.arange(self.n_items)

    def ok(self, rows: IntArray, items: IntArray) -> npt.NDArray[np.bool_]:
        """Whether sample ``rows[i]`` may take ``items[i]``."""
        key = self.user[rows] * self.n_items + items
        hit = np.searchsorted(self._seen, key)
        clicked = self._seen[np.minimum(hit, len(self._seen) - 1)] == key
        return ~clicked & (self._rank[items] < self.k[rows])

    def mask(self, rows: IntArray) -> npt.NDArray[np.bool_]:
        """``[len(rows), n_items]``: True where the sample may take the item."""
        out = self._rank[None, :] < self.k[rows][:, None]  # [R, N] existed by then
        lo = np.searchsorted(self._seen, self.user[rows] * self.n_items)
        hi = np.searchsorted(self._seen, (self.user[rows] + 1) * self.n_items)
        for r, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
            out[r, self._seen[a:b] % self.n_items] = False  # the user's clicked items
        return out


def uniform(rng: np.random.Generator, allowed: Allowed, rows: IntArray) -> IntArray:
    """One allowed item per sample row, uniformly; -1 where none is allowed."""
    out = np.full(len(rows), -1, dtype=np.int64)
    todo = np.flatnonzero(allowed.k[rows] > 0)
    for _ in range(_ROUNDS):
        if len(todo) == 0:
            return out
        draw = allowed.order[(rng.random(len(todo)) * allowed.k[rows[todo]]).astype(np.int64)]
        good = allowed.ok(rows[todo], draw)
        out[todo[good]] = draw[good]
        todo = todo[~good]
    for t in todo.tolist():  # dense user or few items yet: the explicit pool
        pool = np.flatnonzero(allowed.mask(rows[t : t + 1])[0])
        if len(pool):
            out[t] = pool[rng.integers(len(pool))]
    return out


def popularity(
    rng: np.random.Generator, allowed: Allowed, rows: IntArray, positives: Samples, alpha: float
) -> IntArray:
    """One item per sample row ``∝ c(t)^alpha`` (train positives before the row's time)."""
    items = positives.cand.astype(np.int64)
    final = np.bincount(items, minlength=allowed.n_items).astype(np.float64)  # [N]
    cdf = np.cumsum(final**alpha)
    counts = EventCounts(items, positives.ts)
    out = np.full(len(rows), -1, dtype=np.int64)
    todo = np.arange(len(rows))
    for _ in range(_ROUNDS):
        if len(todo) == 0:
            break
        draw = np.searchsorted(cdf, rng.random(len(todo)) * cdf[-1], side="right")
        draw = np.minimum(draw, allowed.n_items - 1)
        t = positives.ts[rows[todo]]
        then = counts.count(draw, np.zeros_like(t), t).astype(np.float64)
        keep = rng.random(len(todo)) < (then / np.maximum(final[draw], 1.0)) ** alpha
        good = keep & allowed.ok(rows[todo], draw)
        out[todo[good]] = draw[good]
        todo = todo[~good]
    out[todo] = uniform(rng, allowed, rows[todo])
    return out


def hard(
    rng: np.random.Generator,
    allowed: Allowed,
    positives: Samples,
    retriever: Retriever,
    ds: Dataset,
    count: int,
    top: int,
) -> IntArray:
    """``count`` items per positive ``[P, count]``, uniformly from the retriever's best ``top``
    allowed items for the positive's history (fewer allowed: all of them, with repeats)."""
    out = np.zeros((len(positives), count), dtype=np.int64)
    for s in range(0, len(positives), _CHUNK):
        rows = np.arange(s, min(s + _CHUNK, len(positives)))
        history = [
            [ds.items[i] for i in positives.hist[r][positives.hist_mask[r]].tolist()]
            for r in rows.tolist()
        ]
        scores = retriever.user_vectors(history) @ retriever.vectors.T  # [b, N]
        scores = np.where(allowed.mask(rows), scores, -np.inf)
        width = min(top, allowed.n_items)
        best = np.argpartition(-scores, width - 1, axis=1)[:, :width]  # [b, top], unordered
        best = np.sort(best, axis=1)  # a seed-stable order, independent of the partition
        real = np.isfinite(np.take_along_axis(scores, best, axis=1))  # [b, top]
        n_real = np.maximum(real.sum(1), 1)
        # the allowed ones first, then sample positions among them
        ranked = np.take_along_axis(best, np.argsort(~real, axis=1, kind="stable"), axis=1)
        pick = (rng.random((len(rows), count)) * n_real[:, None]).astype(np.int64)
        out[rows] = np.take_along_axis(ranked, pick, axis=1)
        empty = real.sum(1) == 0  # nothing allowed in the catalogue: keep a uniform one
        for r in np.flatnonzero(empty).tolist():
            out[rows[r]] = uniform(rng, allowed, np.full(count, rows[r]))
    return out


def with_negatives(
    ds: Dataset,
    train: Samples,
    mix: NegativeMix,
    *,
    seed: int,
    before_ms: int | None,
    retriever: Retriever | None = None,
) -> Samples:
    """``train`` (``[pos, neg]`` pairs as the splits build them) with ``mix.total`` negatives per
    positive. ``before_ms``: the time split's cutoff (None: leave-last-out)."""
    pos = np.flatnonzero(train.label > 0.5)
    if len(pos) * 2 != len(train) or not np.all(train.label[pos + 1] < 0.5):
        raise ValueError("train samples must be [positive, negative] pairs")
    if mix.total == mix.uniform == 1 or len(pos) == 0:
        return train
    if mix.hard and retriever is None:
        raise ConfigError("hard negatives need the retrieval model: drop --no-retrieval")
    positives = Samples(*(getattr(train, f)[pos] for f in Samples.__dataclass_fields__))
    allowed = Allowed(ds, positives, before_ms=before_ms)
    rng = np.random.default_rng([seed, 2])
    rows = np.arange(len(positives))
    columns = [train.cand[pos + 1]] if mix.uniform else []
    columns += [uniform(rng, allowed, rows) for _ in range(max(mix.uniform - 1, 0))]
    columns += [popularity(rng, allowed, rows, positives, mix.alpha) for _ in range(mix.popularity)]
    negs = np.stack(columns, axis=1) if columns else np.zeros((len(pos), 0), dtype=np.int64)
    if mix.hard:
        assert retriever is not None
        found = hard(rng, allowed, positives, retriever, ds, mix.hard, mix.hard_top)
        negs = np.concatenate([negs, found], axis=1)  # [P, k]
    group = 1 + mix.total
    cand = np.concatenate([positives.cand[:, None], negs], axis=1).reshape(-1)  # [P * group]
    label = np.tile(np.r_[1.0, np.zeros(mix.total)].astype(np.float32), len(pos))
    rep = lambda a: np.repeat(a, group, axis=0)  # noqa: E731
    return Samples(rep(positives.user), rep(positives.hist), rep(positives.hist_mask),
                   rep(positives.hist_rows), cand, label, rep(positives.ts))  # fmt: skip


def with_towers(
    ds: Dataset, split: Split, mix: NegativeMix, rcfg: RetrievalConfig | None, *, seed: int,
    before_ms: int | None, progress: bool,
) -> tuple[Split, TrainedRetriever | None]:  # fmt: skip
    """The split's towers (``rcfg`` None: none), trained on its train samples first (the hard
    negatives' source), and the split with ``mix``'s train negatives."""
    towers = None
    if rcfg is not None:
        towers = train_retriever(
            ds, split.train, split.train_item_counts, rcfg, seed=seed, progress=progress
        )
    train = with_negatives(ds, split.train, mix, seed=seed, before_ms=before_ms,
                           retriever=towers[0] if towers else None)  # fmt: skip
    return replace(split, train=train), towers
