"""Stand-ins for the cascade's sources: an exact brute-force retriever (the Retriever protocol
in numpy), a fixed hot-item pool, and slow or failing variants for the fallback rungs."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

import numpy as np


def vector_of(item_id: str, dim: int) -> np.ndarray:
    """A unit vector per id, the same in every process."""
    seed = int.from_bytes(hashlib.sha256(f"retrieval/{item_id}".encode()).digest()[:4], "big")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return (v / np.linalg.norm(v)).astype(np.float32)


class BruteForceRetriever:
    """Exact search: user vector = the normalised mean of the known history items' vectors
    (the mean of all items for an empty history); scores are inner products."""

    def __init__(
        self, item_ids: Sequence[str], categories: Sequence[str] | None = None, *, dim: int = 8
    ) -> None:
        self.item_ids = tuple(item_ids)
        self.categories = tuple(categories) if categories is not None else ("",) * len(item_ids)
        self.dim = dim
        self.vectors = np.stack([vector_of(i, dim) for i in self.item_ids])  # [N, D]
        self._row = {item: row for row, item in enumerate(self.item_ids)}
        self.searches = 0

    def rows(self, ids: Sequence[str]) -> np.ndarray:
        return np.array([self._row.get(i, -1) for i in ids], dtype=np.int64)

    def user_vectors(self, histories: Sequence[Sequence[str]]) -> np.ndarray:
        out = np.empty((len(histories), self.dim), dtype=np.float32)  # [B, D]
        for b, history in enumerate(histories):
            rows = [r for r in self.rows(list(history)).tolist() if r >= 0]
            v = self.vectors[rows].mean(0) if rows else self.vectors.mean(0)
            out[b] = v / max(float(np.linalg.norm(v)), 1e-12)
        return out

    def search(self, users: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        self.searches += 1
        scores = users @ self.vectors.T  # [B, N]
        order = np.argsort(-scores, axis=1, kind="stable")[:, :n]  # [B, n]
        rows = np.full((users.shape[0], n), -1, dtype=np.int64)
        rows[:, : order.shape[1]] = order
        top = np.full((users.shape[0], n), -np.inf, dtype=np.float32)
        top[:, : order.shape[1]] = np.take_along_axis(scores, order, axis=1)
        return rows, top

    def dot(self, users: np.ndarray, rows: np.ndarray) -> np.ndarray:
        vecs = self.vectors[np.maximum(rows, 0)]  # [B, C, D]
        out = np.einsum("bd,bcd->bc", users, vecs).astype(np.float32)  # [B, C]
        out[rows < 0] = -np.inf
        return out

    def memory_bytes(self) -> int:
        return int(self.vectors.nbytes)


class SlowRetriever(BruteForceRetriever):
    """Its search sleeps ``delay_s`` (on the worker thread it runs on) before answering."""

    def __init__(self, *args: object, delay_s: float, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.delay_s = delay_s

    def search(self, users: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        time.sleep(self.delay_s)
        return super().search(users, n)


class BrokenRetriever(BruteForceRetriever):
    def search(self, users: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        raise RuntimeError("index file truncated")


class StaticHot:
    """A hot-item pool with a fixed list."""

    def __init__(self, items: Sequence[str]) -> None:
        self._items = tuple(items)

    def items(self) -> tuple[str, ...]:
        return self._items
