"""Training samples from what was served: the served log joined with the final outcomes.

One sample per scored request, its candidates kept together (list columns, aligned with
``items``): the history the model saw, the items shown, each one's rank by served score, its
label (clicked within the outcome window or not), the served score and the raw feature values
the model used. The features are the logged ones, so a sample is point-in-time correct by
construction. Pure: records and outcomes are parsed JSON objects; reading the topics and
writing files happen in the tools (``workbench/served_dataset.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The columns of a sample, in file order (docs/loop.md#training-data-from-the-served-log).
COLUMNS: tuple[str, ...] = (
    "request_id", "user_id", "model_version", "ts", "served_at", "history_items", "history_ts",
    "history_event_ids", "history_actions", "items", "ranks", "labels", "scores", "codes",
    "counters", "cold_start",
)  # fmt: skip
ColdUsed = Mapping[str, tuple[str, ...]]  # item id -> the categories its cold vector was built from


@dataclass(frozen=True, slots=True)
class ServedSample:
    """One served request as a training sample (lists aligned with ``items``)."""

    request_id: str
    user_id: str
    model_version: str
    ts: int  # epoch ms the features are as of (features.as_of, else served_at)
    served_at: int  # epoch ms
    history_items: tuple[str, ...]  # oldest first, as scored
    history_ts: tuple[int, ...]
    history_event_ids: tuple[str, ...]
    history_actions: tuple[str | None, ...]
    items: tuple[str, ...]  # the items shown, in served order
    ranks: tuple[int, ...]  # 1-based rank by served score (ties: served order)
    labels: tuple[int, ...]  # 1 = clicked within the outcome window
    scores: tuple[float, ...]  # the served scores
    codes: tuple[int, ...] | None = None  # categorical codes of the request (spec order)
    counters: tuple[tuple[int, ...], ...] | None = None  # raw counts [C, F] per item
    # items (shown or in the history) served with a cold-start vector -> the categories used
    cold_start: ColdUsed | None = field(default=None, hash=False)

    def to_row(self) -> dict[str, Any]:
        """The sample as one row of plain values, keys in :data:`COLUMNS` order."""
        return {
            "request_id": self.request_id, "user_id": self.user_id,
            "model_version": self.model_version, "ts": self.ts, "served_at": self.served_at,
            "history_items": list(self.history_items), "history_ts": list(self.history_ts),
            "history_event_ids": list(self.history_event_ids),
            "history_actions": list(self.history_actions), "items": list(self.items),
            "ranks": list(self.ranks), "labels": list(self.labels), "scores": list(self.scores),
            "codes": None if self.codes is None else list(self.codes),
            "counters": None if self.counters is None else [list(r) for r in self.counters],
            "cold_start": None if self.cold_start is None
            else {item: list(names) for item, names in self.cold_start.items()},
        }  # fmt: skip

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ServedSample:
        """A sample from one row (as :meth:`to_row` writes it, or read back from a file)."""
        codes, counters = row.get("codes"), row.get("counters")
        return cls(
            request_id=str(row["request_id"]), user_id=str(row["user_id"]),
            model_version=str(row["model_version"]), ts=int(row["ts"]),
            served_at=int(row["served_at"]),
            history_items=tuple(str(i) for i in row["history_items"]),
            history_ts=tuple(int(t) for t in row["history_ts"]),
            history_event_ids=tuple(str(e) for e in row["history_event_ids"]),
            history_actions=tuple(None if a is None else str(a) for a in row["history_actions"]),
            items=tuple(str(i) for i in row["items"]),
            ranks=tuple(int(r) for r in row["ranks"]),
            labels=tuple(int(x) for x in row["labels"]),
            scores=tuple(float(s) for s in row["scores"]),
            codes=None if codes is None else tuple(int(c) for c in codes),
            counters=None if counters is None else tuple(tuple(int(v) for v in r) for r in counters),
            cold_start=cold_used(row.get("cold_start")),
        )  # fmt: skip


def cold_used(value: Any) -> ColdUsed | None:
    """A logged cold-start map (a JSON object, or the ``(key, value)`` pairs of a Parquet map)
    as ``{item: (category, ...)}``; None when absent or empty."""
    if not value:
        return None
    pairs = value.items() if isinstance(value, Mapping) else value
    return {str(item): tuple(str(n) for n in names) for item, names in pairs}


@dataclass
class JoinCounts:
    """What the join kept and why it left the rest out."""

    served: int = 0  # served-log records read
    joined: int = 0  # samples written
    degraded: int = 0  # fallback scores: not the version's, skipped
    not_final: int = 0  # no final outcome (yet): skipped
    duplicate: int = 0  # a request_id seen before (redelivery): the first kept
    invalid: int = 0  # a record lacking what a sample needs
    mismatched: int = 0  # the outcome's items differ from the served ones
    filtered: int = 0  # outside --since/--until or not one of --versions
    outcomes: int = 0  # outcome records read
    outcomes_duplicate: int = 0
    outcomes_unmatched: int = 0  # final outcomes of requests not in the served log read

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class JoinResult:
    samples: list[ServedSample] = field(default_factory=list)
    counts: JoinCounts = field(default_factory=JoinCounts)


@dataclass(frozen=True)
class DatasetInfo:
    """Which exported dataset a version was trained on (from its manifest)."""

    path: str
    sha256: str
    rows: int
    versions: tuple[str, ...]  # the versions that served its requests

    def to_json(self) -> dict[str, Any]:
        return {"name": "served-log", "path": self.path, "sha256": self.sha256,
                "rows": self.rows, "served_versions": list(self.versions)}  # fmt: skip


def ranks_by_score(scores: Sequence[float]) -> list[int]:
    """1-based rank of each item by descending score, ties in served order (the outcomes
    worker's rule, ``scoring.rollout.stats.ranks_by_score``)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    ranks = [0] * len(scores)
    for r, i in enumerate(order, start=1):
        ranks[i] = r
    return ranks


def _outcomes_by_request(
    outcomes: Iterable[Mapping[str, Any]], counts: JoinCounts
) -> dict[str, Mapping[str, Any]]:
    found: dict[str, Mapping[str, Any]] = {}
    for outcome in outcomes:
        counts.outcomes += 1
        request_id = outcome.get("request_id") if isinstance(outcome, Mapping) else None
        if not isinstance(request_id, str):
            continue
        if request_id in found:
            counts.outcomes_duplicate += 1
            continue
        found[request_id] = outcome
    return found


def _sample(record: Mapping[str, Any], outcome: Mapping[str, Any]) -> ServedSample:
    """One sample; KeyError/TypeError/ValueError when the record lacks what it needs."""
    items = tuple(str(i) for i in record["items"])
    scores = tuple(float(s) for s in record["scores"])
    if len(scores) != len(items) or not items:
        raise ValueError("scores are not aligned with items")
    clicked = {str(c["item"]) for c in outcome.get("clicked") or ()}
    seq = record["sequence"]
    history = tuple(str(i) for i in seq["item_ids"])
    actions = seq.get("actions") or [None] * len(history)
    features = record.get("features") or {}
    codes, counters = features.get("codes"), features.get("counters")
    if counters is not None and len(counters) != len(items):
        raise ValueError("counters are not aligned with items")
    served_at = int(record["served_at"])
    return ServedSample(
        request_id=str(record["request_id"]), user_id=str(record["user_id"]),
        model_version=str(record["model_version"]), ts=int(features.get("as_of", served_at)),
        served_at=served_at, history_items=history,
        history_ts=tuple(int(t) for t in seq["ts"]),
        history_event_ids=tuple(str(e) for e in seq["event_ids"]),
        history_actions=tuple(None if a is None else str(a) for a in actions),
        items=items, ranks=tuple(ranks_by_score(scores)),
        labels=tuple(int(i in clicked) for i in items), scores=scores,
        codes=None if codes is None else tuple(int(c) for c in codes),
        counters=None if counters is None else tuple(tuple(int(v) for v in r) for r in counters),
        cold_start=cold_used(record.get("cold_start")),
    )  # fmt: skip


def join_served(
    records: Iterable[Mapping[str, Any]],
    outcomes: Iterable[Mapping[str, Any]],
    *,
    since_ms: int | None = None,
    until_ms: int | None = None,
    versions: Collection[str] | None = None,
) -> JoinResult:
    """Served-log records + final outcomes -> samples, in served_at order (then request_id).

    Skipped and counted: degraded records, records without a final outcome, repeated
    request_ids (the first kept), records outside ``[since_ms, until_ms)`` of served_at or of
    another version than ``versions``, records lacking a field, outcomes whose items differ."""
    result = JoinResult()
    counts = result.counts
    final = _outcomes_by_request(outcomes, counts)
    seen: set[str] = set()
    for record in records:
        counts.served += 1
        request_id = record.get("request_id") if isinstance(record, Mapping) else None
        if not isinstance(request_id, str):
            counts.invalid += 1
            continue
        if request_id in seen:
            counts.duplicate += 1
            continue
        seen.add(request_id)
        if record.get("degraded") is True:
            counts.degraded += 1
            continue
        served_at = record.get("served_at")
        if (
            (versions is not None and record.get("model_version") not in versions)
            or (since_ms is not None and isinstance(served_at, int) and served_at < since_ms)
            or (until_ms is not None and isinstance(served_at, int) and served_at >= until_ms)
        ):
            counts.filtered += 1
            continue
        outcome = final.get(request_id)
        if outcome is None:
            counts.not_final += 1
            continue
        if [str(i) for i in outcome.get("items") or ()] != [
            str(i) for i in record.get("items") or ()
        ]:
            counts.mismatched += 1
            continue
        try:
            result.samples.append(_sample(record, outcome))
        except (KeyError, TypeError, ValueError):
            counts.invalid += 1
    counts.joined = len(result.samples)
    counts.outcomes_unmatched = len(set(final) - seen)
    result.samples.sort(key=lambda s: (s.served_at, s.request_id))
    return result


def time_split(
    samples: Sequence[ServedSample], valid_share: float
) -> tuple[list[ServedSample], list[ServedSample]]:
    """(train, validation): the last ``valid_share`` of the requests by time are validation."""
    if not 0.0 <= valid_share < 1.0:
        raise ValueError(f"validation share {valid_share} must be in [0, 1)")
    ordered = sorted(samples, key=lambda s: (s.served_at, s.request_id))
    n_valid = round(len(ordered) * valid_share)
    cut = len(ordered) - n_valid
    return ordered[:cut], ordered[cut:]


def summary(samples: Sequence[ServedSample]) -> dict[str, Any]:
    """Rows, impressions, clicks, the versions served and the time range (epoch ms)."""
    versions: dict[str, int] = {}
    for s in samples:
        versions[s.model_version] = versions.get(s.model_version, 0) + 1
    return {
        "rows": len(samples),
        "impressions": sum(len(s.items) for s in samples),
        "clicks": sum(sum(s.labels) for s in samples),
        "versions": dict(sorted(versions.items())),
        "served_at": {
            "min": min((s.served_at for s in samples), default=None),
            "max": max((s.served_at for s in samples), default=None),
        },
    }
