"""The pure parts of ``streamrank bench loop``: the log cut into a training part and simulated
days, the candidates of each request, and the figures from what the arms were served."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from scoring.training.data import Dataset, time_order
from scoring.training.served_data import ranks_by_score

DAY_S = 86_400


def say(message: str) -> None:
    print(f"bench loop: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class LoopEvent:
    """One click of the streamed part; ``request``: a ranking request for its user precedes it,
    with the clicked item among the candidates; ``first``: the item's first appearance after
    the cut (an item version 1 never saw)."""

    seq: int
    user: str
    item: str
    category: str
    ts_s: int
    day: int
    request: bool
    first: bool


@dataclass(frozen=True)
class LoopPlan:
    train_rows: npt.NDArray[np.int64]  # rows before the cut, in time order
    events: tuple[LoopEvent, ...]  # the streamed part, in time order
    known: frozenset[str]  # items that appear before the cut
    categories: Mapping[str, str]  # every catalogue item's categories, "A|B"
    days: int

    def by_day(self) -> list[list[LoopEvent]]:
        out: list[list[LoopEvent]] = [[] for _ in range(self.days)]
        for e in self.events:
            out[e.day].append(e)
        return out

    def new_items(self) -> list[str]:
        return [e.item for e in self.events if e.first]


def plan_loop(
    ds: Dataset, *, split: float, days: int | None, request_share: float, seed: int
) -> LoopPlan:
    """Cut the log at ``split`` of its events in time order; the rest is streamed day by day
    (the first ``days`` days only, when given). Which clicks get a request is drawn with
    ``seed``, so every arm and every run sees the same requests."""
    if not 0.0 < split < 1.0:
        raise ValueError(f"split {split} must be in (0, 1)")
    rows = time_order(ds)
    cut = int(len(rows) * split)
    start_s = int(ds.ts[rows[cut]])
    known = {ds.items[i] for i in ds.item_index[rows[:cut]].tolist()}
    draw = np.random.default_rng(seed).random(len(rows) - cut) < request_share
    seen = set(known)
    events = []
    for k, r in enumerate(rows[cut:].tolist()):
        day = (int(ds.ts[r]) - start_s) // DAY_S
        if days is not None and day >= days:
            break
        item_index = int(ds.item_index[r])
        item = ds.items[item_index]
        first = item not in seen
        seen.add(item)
        events.append(LoopEvent(seq=k, user=str(ds.user_ids[r]), item=item,
                                category=ds.item_category(item_index), ts_s=int(ds.ts[r]),
                                day=day, request=bool(draw[k]), first=first))  # fmt: skip
    categories = {ds.items[i]: ds.item_category(i) for i in range(len(ds.items))}
    n_days = (events[-1].day + 1) if events else 0
    return LoopPlan(rows[:cut], tuple(events), frozenset(known), categories, n_days)


def candidates(
    event: LoopEvent, available: Sequence[str], *, n: int, seed: int, exclude: Iterable[str] = ()
) -> tuple[list[str], int]:
    """The clicked item and ``n - 1`` others drawn from ``available`` (items that exist by
    then, less ``exclude``), in a drawn order; returns them and the clicked item's position."""
    rng = np.random.default_rng([seed, event.seq])
    banned = {event.item, *exclude}
    pool = [i for i in available if i not in banned]
    picked = [pool[j] for j in rng.choice(len(pool), size=min(n - 1, len(pool)), replace=False)]
    where = int(rng.integers(len(picked) + 1))
    picked.insert(where, event.item)
    return picked, where


def hit_at(scores: Sequence[float], position: int, k: int = 10) -> bool:
    """Is the item at ``position`` in the top ``k`` by score (ties: served order)?"""
    return ranks_by_score(list(scores))[position] <= k


def periods(days: int, count: int) -> list[range]:
    """``days`` cut into ``count`` consecutive periods of (nearly) equal length."""
    count = max(1, min(count, days))
    edges = np.linspace(0, days, count + 1).round().astype(int).tolist()
    return [range(a, b) for a, b in itertools.pairwise(edges) if b > a]


def period_figures(
    hits: Sequence[tuple[int, bool]], spans: Sequence[range]
) -> list[dict[str, Any]]:
    """HR@10 per period from ``(day, hit)`` per answered request."""
    out = []
    for n, span in enumerate(spans):
        got = [h for d, h in hits if d in span]
        out.append({"period": n + 1, "days": [span.start, span.stop - 1], "requests": len(got),
                    "hr@10": round(float(np.mean(got)), 5) if got else None})  # fmt: skip
    return out


def later_half_gain(
    loop: Sequence[dict[str, Any]], frozen: Sequence[dict[str, Any]]
) -> float | None:
    """Loop HR@10 minus frozen HR@10 over the later half of the periods, request-weighted."""
    half = len(loop) // 2
    pairs = [(a, b) for a, b in zip(loop[half:], frozen[half:], strict=True)
             if a["hr@10"] is not None and b["hr@10"] is not None]  # fmt: skip
    if not pairs:
        return None
    weights = np.array([a["requests"] for a, _ in pairs], dtype=np.float64)
    diff = np.array([a["hr@10"] - b["hr@10"] for a, b in pairs])
    return round(float((weights * diff).sum() / weights.sum()), 5)


def unseen_scoring(
    records: Iterable[Mapping[str, Any]], vocabulary: Mapping[str, frozenset[str]]
) -> dict[str, Any]:
    """How the served log scored items its version did not know: requests with such an item,
    and the share of those whose every unknown item got a cold-start vector (the rest got the
    OOV row for at least one)."""
    total = unseen = cold = 0
    for record in records:
        if record.get("degraded"):
            continue
        total += 1
        known = vocabulary.get(str(record.get("model_version")))
        if known is None:
            continue
        missing = {i for i in record.get("items") or () if i not in known}
        if not missing:
            continue
        unseen += 1
        cold += int(missing <= set((record.get("cold_start") or {}).keys()))
    return {
        "requests": total,
        "with_unseen_item": unseen,
        "with_unseen_item_share": round(unseen / total, 5) if total else None,
        "cold_start_share": round(cold / unseen, 5) if unseen else None,
    }
