"""The feature specification of a model version, and the one code that turns raw feature values
into model inputs, online and offline.

A version's ``config.json`` carries its spec under ``feature_spec.inputs``. Families:

* ``sequence`` (always): the user's latest ``sequence_length`` events strictly before the
  request's time, each an item vector plus, when the spec has an action vocabulary, the event's
  action (an embedding added to the item vector).
* ``counters``: windowed click counts as of the request's time (:data:`COUNTERS`), ``log1p``
  scaled, one row per candidate (user counts repeat on every row).
* ``context``: hour of day and day of week (UTC) of the request's time, and each request
  ``context`` key the spec declares, through its vocabulary.
* ``attributes``: the user's offline attributes (age bucket, gender, occupation), through their
  vocabularies.

Every vocabulary maps an unknown or absent value to code 0. The windows are the counters'
bucket sizes at training time; a worker whose buckets differ cannot serve the version
(:func:`check_servable`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrank.errors import ArtifactError
from streamrank.settings import FeatureSettings

FAMILIES: tuple[str, ...] = ("sequence", "counters", "context", "attributes")
SIDE_FAMILIES: tuple[str, ...] = FAMILIES[1:]
UNKNOWN = "unknown"
TIME_CONTEXT: tuple[tuple[str, int], ...] = (("hour_of_day", 24), ("day_of_week", 7))
# Age buckets as in MovieLens-1M: under 18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+.
_AGE_EDGES = np.asarray((18, 25, 35, 45, 50, 56))
AGE_BUCKETS: tuple[str, ...] = ("<18", "18-24", "25-34", "35-44", "45-49", "50-55", "56+")


@dataclass(frozen=True, slots=True)
class Counter:
    """One windowed count: whose clicks (``user``, ``item`` = the candidate's, or
    ``user_category`` = the user's clicks in the candidate's category) over which window."""

    name: str
    entity: str
    window: str


COUNTERS: tuple[Counter, ...] = (
    Counter("user_clicks_1h", "user", "1h"),
    Counter("user_clicks_24h", "user", "24h"),
    Counter("item_clicks_1h", "item", "1h"),
    Counter("item_clicks_24h", "item", "24h"),
    Counter("user_category_clicks_24h", "user_category", "24h"),
)


def parse_families(text: str) -> tuple[str, ...]:
    """``"sequence,counters"`` -> the families in canonical order (``sequence`` always in)."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown feature families {unknown}: use {', '.join(FAMILIES)}")
    return tuple(f for f in FAMILIES if f in names or f == "sequence")


def age_bucket(age: str) -> str:
    """The age bucket of a raw age string (``unknown`` when it is not a number)."""
    try:
        years = int(float(age))
    except (ValueError, OverflowError):  # "x", "nan"; "inf"
        return UNKNOWN
    return AGE_BUCKETS[int(np.searchsorted(_AGE_EDGES, years, side="right"))]


@dataclass(frozen=True)
class FeatureSpec:
    """Every input of one model version (what ``config.json`` records under
    ``feature_spec.inputs``)."""

    families: tuple[str, ...] = ("sequence",)
    sequence_length: int = 50
    actions: tuple[str, ...] = ()  # action vocabulary (code 0 = unknown); empty = no action input
    windows: Mapping[str, int] = field(default_factory=dict)  # "1h"/"24h" -> bucket size, s
    context_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    user_attributes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def has(self, family: str) -> bool:
        return family in self.families

    @property
    def counters(self) -> tuple[Counter, ...]:
        return COUNTERS if self.has("counters") else ()

    @property
    def categorical(self) -> list[tuple[str, int]]:
        """The per-request categorical inputs in code order: (name, vocabulary size)."""
        out: list[tuple[str, int]] = []
        if self.has("context"):
            out += TIME_CONTEXT
            out += [(f"context.{k}", len(v) + 1) for k, v in self.context_keys.items()]
        if self.has("attributes"):
            out += [(f"user.{k}", len(v) + 1) for k, v in self.user_attributes.items()]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "families": list(self.families),
            "sequence": {
                "length": self.sequence_length,
                "fields": ["item", "category", *(["action"] if self.actions else [])],
                "cut": "events with ts < the request's time, (ts, event_id) order",
                "actions": list(self.actions),
            },
            "counters": [
                {"name": c.name, "entity": c.entity, "window": c.window, "transform": "log1p"}
                for c in self.counters
            ],
            "windows": dict(self.windows),
            "context": {
                "time": [n for n, _ in TIME_CONTEXT] if self.has("context") else [],
                "keys": {k: list(v) for k, v in self.context_keys.items()},
            },
            "attributes": {"user": {k: list(v) for k, v in self.user_attributes.items()}},
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None, *, default_length: int) -> FeatureSpec:
        """The spec of a config (a version without one: the sequence alone)."""
        if not raw:
            return cls(sequence_length=default_length)
        try:
            families = tuple(raw["families"])
            spec = cls(
                families=families,
                sequence_length=int(raw["sequence"]["length"]),
                actions=tuple(raw["sequence"].get("actions", ())),
                windows={str(k): int(v) for k, v in raw.get("windows", {}).items()},
                context_keys={k: tuple(v) for k, v in raw["context"]["keys"].items()},
                user_attributes={k: tuple(v) for k, v in raw["attributes"]["user"].items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"config.json 'feature_spec.inputs' is invalid: {exc!r}") from exc
        unknown = sorted(set(families) - set(FAMILIES))
        if unknown or "sequence" not in families:
            raise ArtifactError(
                f"config.json 'feature_spec.inputs': feature families {list(families)} are not "
                f"servable (known: {', '.join(FAMILIES)}; 'sequence' is required)"
            )
        return spec


def check_servable(spec: FeatureSpec, features: FeatureSettings) -> None:
    """Raise :class:`ArtifactError` naming the input that workers with these feature settings
    cannot produce as the version was trained."""
    sequence_cap = features.sequence_length
    windows = {"1h": features.counter_bucket_s, "24h": features.counter_coarse_bucket_s}
    if spec.sequence_length > sequence_cap:
        raise ArtifactError(
            f"input 'sequence' needs {spec.sequence_length} events per user but the features "
            f"workers keep {sequence_cap} (STREAMRANK_SEQUENCE_LENGTH)"
        )
    if spec.has("counters"):
        for name, size in spec.windows.items():
            if windows.get(name) != size:
                raise ArtifactError(
                    f"input 'counters' was trained on {name} windows of {size} s buckets; this "
                    f"worker's are {windows.get(name)} s (STREAMRANK_COUNTER_BUCKET_S / "
                    "STREAMRANK_COUNTER_COARSE_BUCKET_S must match the training settings)"
                )


# --- raw values -> model inputs (the one transform, online and offline) -----------------------


def vocab_code(vocab: Sequence[str], value: Any) -> int:
    """Code of ``value`` in ``vocab`` (1-based); 0 for unknown or absent."""
    if value is None:
        return 0
    try:
        return vocab.index(str(value)) + 1
    except ValueError:
        return 0


def time_codes(as_of_ms: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """``[n, 2]``: hour of day (0-23) and day of week (0 = Monday) in UTC of each time."""
    seconds = np.asarray(as_of_ms, dtype=np.int64) // 1000
    hour = seconds // 3600 % 24
    dow = (seconds // 86400 + 3) % 7  # 1970-01-01 was a Thursday
    return np.stack([hour, dow], axis=-1)


def user_codes(
    spec: FeatureSpec,
    as_of_ms: int,
    context: Mapping[str, Any] | None,
    attributes: Mapping[str, str] | None,
) -> list[int]:
    """The categorical inputs of one request, in :attr:`FeatureSpec.categorical` order."""
    codes: list[int] = []
    if spec.has("context"):
        codes += time_codes([as_of_ms])[0].tolist()
        codes += context_key_codes(spec, context)
    if spec.has("attributes"):
        codes += attribute_codes(spec, attributes)
    return codes


def context_key_codes(spec: FeatureSpec, context: Mapping[str, Any] | None) -> list[int]:
    """Codes of the request ``context`` keys the spec declares."""
    ctx = context or {}
    return [vocab_code(v, ctx.get(k)) for k, v in spec.context_keys.items()]


def attribute_codes(spec: FeatureSpec, attributes: Mapping[str, str] | None) -> list[int]:
    """Codes of the user's attributes the spec declares (raw ages go through their buckets)."""
    attrs = attributes or {}
    codes = []
    for name, vocab in spec.user_attributes.items():
        value = attrs.get(name)
        if name == "age" and value is not None:
            value = age_bucket(value)
        codes.append(vocab_code(vocab, value))
    return codes


def action_codes(spec: FeatureSpec, actions: Sequence[str | None]) -> list[int]:
    """Codes of a history's actions (all 0 when the spec has no action input)."""
    if not spec.actions:
        return [0] * len(actions)
    return [vocab_code(spec.actions, a) for a in actions]


def dense_counters(counts: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Raw counts ``[..., F]`` -> the model's dense input (``log1p``), float32."""
    return np.log1p(np.maximum(np.asarray(counts, dtype=np.float64), 0.0)).astype(np.float32)
