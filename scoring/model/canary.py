"""Which model version serves a user: the active pointer, or a canary split by stable hash."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from streamrank.errors import ConfigError

Split = tuple[tuple[str, float], ...]  # (version, weight), weights sum to 1


def parse_split(text: str) -> Split:
    """``"din-a:0.9,din-b:0.1"`` -> ``(("din-a", 0.9), ("din-b", 0.1))`` (weights normalised)."""
    parts: list[tuple[str, float]] = []
    for chunk in text.split(","):
        chunk = chunk.strip()
        if not chunk:
            continue
        version, sep, weight_text = chunk.rpartition(":")
        if not sep or not version:
            raise ConfigError(
                f"canary split entry {chunk!r} is not VERSION:WEIGHT (e.g. din-a:0.9)"
            )
        try:
            weight = float(weight_text)
        except ValueError:
            raise ConfigError(
                f"canary split weight {weight_text!r} of {version!r} is not a number"
            ) from None
        if weight < 0:
            raise ConfigError(f"canary split weight of {version!r} is negative")
        parts.append((version, weight))
    if not parts:
        raise ConfigError(f"canary split {text!r} names no version")
    if len({v for v, _ in parts}) != len(parts):
        raise ConfigError(f"canary split {text!r} names a version twice")
    total = sum(w for _, w in parts)
    if total <= 0:
        raise ConfigError(f"canary split {text!r} has no positive weight")
    return tuple((v, w / total) for v, w in parts)


def user_bucket(user_id: str) -> float:
    """A stable number in [0, 1) for a user: the same in every process and every run."""
    digest = hashlib.blake2b(user_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def assign(user_ids: Sequence[str], split: Split) -> list[str]:
    """The version serving each user (cumulative weights over the user's bucket)."""
    if len(split) == 1:
        return [split[0][0]] * len(user_ids)
    out = []
    for user_id in user_ids:
        point = user_bucket(user_id)
        acc = 0.0
        chosen = split[-1][0]
        for version, weight in split:
            acc += weight
            if point < acc:
                chosen = version
                break
        out.append(chosen)
    return out
