"""Stable id -> bucket mapping of the embedding store, vectorised over a batch of ids.

The bucket of a row must be the same in every process and every Python run, so Python's salted
``hash()`` is out. We take zlib's CRC-32 of the id's UTF-8 bytes (C code, stable everywhere),
spread it to 64 bits with the splitmix64 finaliser (vectorised over the batch; CRC's low bits
alone are linear and poorly mixed for a modulus), then ``% n_buckets``.

A fully vectorised hash (FNV-1a over the joined bytes) is slower: one numpy pass per character
position costs more than one C call per id (docs/embeddings.md#redis-layout).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

_MASK64 = (1 << 64) - 1

U64 = npt.NDArray[np.uint64]


def _splitmix64(h: U64) -> U64:
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def stable_hash(ids: Sequence[str]) -> U64:
    """64-bit stable hash of each id: CRC-32 of its UTF-8 bytes, mixed by splitmix64; ``uint64[n]``."""
    crc = np.fromiter((zlib.crc32(i.encode("utf-8")) for i in ids), dtype=np.uint64, count=len(ids))
    with np.errstate(over="ignore"):
        return _splitmix64(crc)


def reference_hash(id_: str) -> int:
    """The same hash of one id in plain integer arithmetic: the specification of ``stable_hash``."""
    h = zlib.crc32(id_.encode("utf-8"))
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & _MASK64
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & _MASK64
    return h ^ (h >> 31)


def bucket_of(ids: Sequence[str], n_buckets: int) -> npt.NDArray[np.int64]:
    """The bucket number of each id, ``int64[len(ids)]`` in ``[0, n_buckets)``."""
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be >= 1, got {n_buckets}")
    return (stable_hash(ids) % np.uint64(n_buckets)).astype(np.int64)


def choose_bucket_count(hashes: U64, *, max_entries: int, target_fill: float = 0.6) -> int:
    """Fewest buckets (about ``target_fill * max_entries`` rows each) with no bucket over ``max_entries``.

    Fewer buckets mean fewer top-level keys (tens of bytes each); a bucket over
    ``max_entries`` leaves Redis' compact encoding and costs several times the memory, so the
    count grows until the fullest bucket fits.
    """
    if max_entries < 1:
        raise ValueError(f"max_entries must be >= 1, got {max_entries}")
    n = len(hashes)
    if n == 0:
        return 1
    n_buckets = max(1, int(np.ceil(n / max(1.0, target_fill * max_entries))))
    while True:
        counts = np.bincount((hashes % np.uint64(n_buckets)).astype(np.int64), minlength=n_buckets)
        if int(counts.max()) <= max_entries:
            return n_buckets
        n_buckets = int(n_buckets * 1.1) + 1


def group_by_bucket(
    buckets: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], list[npt.NDArray[np.int64]]]:
    """Group positions by bucket: ``(order, unique_buckets, groups)``.

    ``groups[k]`` holds the positions (into ``buckets``) of the ids in ``unique_buckets[k]``;
    ``order`` is all positions sorted by bucket (stable), i.e. the groups concatenated.
    """
    order = np.argsort(buckets, kind="stable")  # [n]
    sorted_b = buckets[order]  # [n]
    if len(sorted_b) == 0:
        return order, sorted_b, []
    cuts = np.flatnonzero(sorted_b[1:] != sorted_b[:-1]) + 1  # [k - 1]
    unique = sorted_b[np.concatenate([[0], cuts])]  # [k]
    return order, unique, np.split(order, cuts)
