"""The retrieval stage's model: a two-tower network, and :class:`Retriever`, its serving form.

* **Item tower**: an id embedding (one row per item of the DIN artifact's vocabulary, in
  ``item_ids.txt`` order) plus, optionally, a projection of the mean of the item's category
  embeddings; L2-normalised. At export the tower is materialised into the item vectors
  ``[rows, dim]`` the ANN index (:mod:`scoring.model.ann`) is built over.
* **User tower**, sharing the item vectors: over the user's history (the last ``history_len``
  item ids, oldest first, the DIN's cut; unknown ids are left out), ``mean + MLP([mean, last])``,
  L2-normalised. An empty history gets the popularity direction (the normalised
  count-weighted sum of the item vectors).
* Score = inner product of the two (cosine: both sides are unit vectors).

:class:`Retriever` computes user vectors with numpy, one history at a time, so a history gives
the same float32 vector whatever batch it comes in: the offline evaluation and the scoring
worker run this one code. No pickle: the weights are safetensors, the index faiss' own format.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from safetensors.numpy import load as np_load
from safetensors.numpy import save as np_save
from torch import Tensor, nn
from torch.nn import functional as F

from scoring.model.ann import AnnIndex, IndexOptions, build_index, index_bytes, stored_vectors
from streamrank.errors import ArtifactError

RETRIEVAL_FILE = "retrieval.safetensors"
INDEX_FILE = "index.faiss"
USER_WEIGHTS = ("user.0.weight", "user.0.bias", "user.2.weight", "user.2.bias")
EPS = 1e-12


@dataclass(frozen=True)
class RetrievalSpec:
    """Architecture of the two towers (config.json ``retrieval.model``)."""

    dim: int = 32  # the vectors' dimension
    hidden: int = 64  # the user tower's hidden layer
    category_dim: int = 8  # 0: the item tower ignores categories
    history_len: int = 50  # the history cut, as the DIN's

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RetrievalSpec:
        try:
            spec = cls(
                dim=int(raw["dim"]),
                hidden=int(raw["hidden"]),
                category_dim=int(raw["category_dim"]),
                history_len=int(raw["history_len"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"config.json 'retrieval.model' is invalid: {exc!r}") from exc
        if min(spec.dim, spec.hidden, spec.history_len) < 1 or spec.category_dim < 0:
            raise ArtifactError(f"config.json 'retrieval.model' has a non-positive size: {spec}")
        return spec


class TwoTower(nn.Module):
    """The two towers in torch (training only; serving uses :class:`Retriever`)."""

    item_genres: Tensor  # [N, G] buffer
    genre_weights: Tensor  # [N, G] buffer

    def __init__(self, spec: RetrievalSpec, *, n_items: int, item_genres: Tensor,
                 genre_mask: Tensor, n_genres: int) -> None:  # fmt: skip
        super().__init__()
        self.spec = spec
        d = spec.dim
        self.ids = nn.Embedding(n_items, d)
        nn.init.normal_(self.ids.weight, std=0.1)
        self.categories = nn.Embedding(n_genres, spec.category_dim) if spec.category_dim else None
        self.category_proj = (
            nn.Linear(spec.category_dim, d, bias=False) if spec.category_dim else None
        )
        weights = genre_mask.float() / genre_mask.float().sum(1, keepdim=True).clamp(min=1)
        self.register_buffer("item_genres", item_genres.long(), persistent=False)  # [N, G]
        self.register_buffer("genre_weights", weights, persistent=False)  # [N, G]
        self.user = nn.Sequential(
            nn.Linear(2 * d, spec.hidden), nn.ReLU(), nn.Linear(spec.hidden, d)
        )

    def items(self, idx: Tensor) -> Tensor:
        """``idx [...]`` item indices -> unit item vectors ``[..., D]``."""
        v = self.ids(idx)  # [..., D]
        if self.categories is not None and self.category_proj is not None:
            cat = self.categories(self.item_genres[idx])  # [..., G, c]
            cat = (cat * self.genre_weights[idx].unsqueeze(-1)).sum(-2)  # [..., c]
            v = v + self.category_proj(cat)  # [..., D]
        return F.normalize(v, dim=-1, eps=EPS)

    def users(self, hist: Tensor, hist_mask: Tensor) -> Tensor:
        """``hist [B, L, D]`` item vectors, left-aligned, ``hist_mask [B, L]`` bool (at least one
        event per row) -> unit user vectors ``[B, D]``."""
        m = hist_mask.unsqueeze(-1).float()  # [B, L, 1]
        count = m.sum(1).clamp(min=1)  # [B, 1]
        mean = (hist * m).sum(1) / count  # [B, D]
        last_pos = (hist_mask.sum(1) - 1).clamp(min=0)  # [B]
        last = hist[torch.arange(hist.shape[0]), last_pos]  # [B, D]
        out = mean + self.user(torch.cat([mean, last], dim=-1))  # [B, D]
        return F.normalize(out, dim=-1, eps=EPS)

    @torch.no_grad()
    def item_table(self, chunk: int = 65536) -> npt.NDArray[np.float32]:
        """The materialised unit item vectors ``[n_items, D]``."""
        n = self.ids.num_embeddings
        parts = [self.items(torch.arange(s, min(s + chunk, n))) for s in range(0, n, chunk)]
        return torch.cat(parts).numpy().astype(np.float32)

    def user_weights(self) -> dict[str, npt.NDArray[np.float32]]:
        state = self.state_dict()
        return {k: state[k].detach().numpy().astype(np.float32).copy() for k in USER_WEIGHTS}


def _unit(v: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norm = np.float32(max(float(np.sqrt(np.dot(v, v))), EPS))
    return (v / norm).astype(np.float32)


def popularity_direction(
    vectors: npt.NDArray[np.float32], counts: npt.NDArray[np.int64]
) -> npt.NDArray[np.float32]:
    """The empty history's vector: the normalised count-weighted sum of the item vectors (their
    mean when nothing was counted)."""
    weights = counts.astype(np.float64) if counts.sum() > 0 else np.ones(len(vectors))
    return _unit((weights @ vectors.astype(np.float64)).astype(np.float32))


@dataclass(frozen=True)
class RetrievalFiles:
    """The retrieval part of an artifact: config.json's ``retrieval`` section and the bytes of
    :data:`RETRIEVAL_FILE` (vectors, categories, user tower) and :data:`INDEX_FILE`."""

    config: dict[str, Any]
    weights: bytes
    index: bytes


class Retriever:
    """A version's retrieval model in process: user vectors, ANN search, exact dot products."""

    def __init__(
        self,
        *,
        item_ids: Sequence[str],
        categories: Sequence[str],
        vectors: npt.NDArray[np.float32],
        empty: npt.NDArray[np.float32],
        weights: Mapping[str, npt.NDArray[np.float32]],
        index: AnnIndex,
        history_len: int,
    ) -> None:
        self.item_ids: tuple[str, ...] = tuple(item_ids)
        self.categories: tuple[str, ...] = tuple(categories)
        self.dim: int = int(vectors.shape[1])
        self.history_len = history_len
        self.index = index
        self._vectors = vectors  # [N, D] unit rows
        self._empty = empty  # [D]
        self._w1t = np.ascontiguousarray(weights["user.0.weight"].T)  # [2D, H]
        self._b1 = weights["user.0.bias"]  # [H]
        self._w2t = np.ascontiguousarray(weights["user.2.weight"].T)  # [H, D]
        self._b2 = weights["user.2.bias"]  # [D]
        self._row_of = {item: row for row, item in enumerate(self.item_ids)}

    def rows(self, ids: Sequence[str]) -> npt.NDArray[np.int64]:
        """Rows ``[n]`` of raw item ids; -1 for an id the version does not know."""
        get = self._row_of.get
        return np.fromiter((get(i, -1) for i in ids), dtype=np.int64, count=len(ids))

    def _user(self, history: Sequence[str]) -> npt.NDArray[np.float32]:
        """One history (raw ids, oldest first) -> its unit vector ``[D]``."""
        rows = [r for r in self.rows(list(history)[-self.history_len :]).tolist() if r >= 0]
        if not rows:
            return self._empty
        vecs = self._vectors[rows]  # [l, D]
        mean = vecs.mean(axis=0, dtype=np.float32)  # [D]
        x = np.concatenate([mean, vecs[-1]])  # [2D]
        h = np.maximum(x @ self._w1t + self._b1, np.float32(0))  # [H]
        return _unit(mean + h @ self._w2t + self._b2)  # [D]

    def user_vectors(self, histories: Sequence[Sequence[str]]) -> npt.NDArray[np.float32]:
        """Unit user vectors ``[B, D]`` float32; each history holds raw ids, oldest first (only
        the last ``history_len`` count; unknown ids are left out; an empty one gets the
        popularity direction). A history's vector does not depend on the batch it is in."""
        out = np.empty((len(histories), self.dim), dtype=np.float32)  # [B, D]
        for b, history in enumerate(histories):
            out[b] = self._user(history)
        return out

    def search(
        self, users: npt.NDArray[np.float32], n: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """ANN: the ``n`` best rows ``[B, n]`` int64 (-1 padded) and their scores ``[B, n]``
        float32, best first."""
        return self.index.search(users, n)

    def dot(
        self, users: npt.NDArray[np.float32], rows: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        """Exact scores ``[B, C]`` of ``users [B, D]`` against ``rows [B, C]``; -1 rows get -inf."""
        rows = np.asarray(rows, dtype=np.int64)  # [B, C]
        vecs = self._vectors[np.maximum(rows, 0)]  # [B, C, D]
        scores = np.matmul(vecs, np.asarray(users, dtype=np.float32)[:, :, None])[..., 0]  # [B, C]
        return np.where(rows >= 0, scores, np.float32(-np.inf)).astype(np.float32)

    def memory_bytes(self) -> int:
        """Bytes held: the index, the item vectors (unless the index holds them), the user
        tower and the id lookup."""
        weights = self._w1t.nbytes + self._b1.nbytes + self._w2t.nbytes + self._b2.nbytes
        ids = sys.getsizeof(self._row_of) + sum(sys.getsizeof(i) for i in self.item_ids)
        shared = stored_vectors(self.index.index)
        vectors = (
            0
            if shared is not None and np.shares_memory(shared, self._vectors)
            else self._vectors.nbytes
        )
        return int(self.index.nbytes + vectors + weights + ids)

    @property
    def vectors(self) -> npt.NDArray[np.float32]:
        """The unit item vectors ``[N, D]`` (read only)."""
        view = self._vectors.view()
        view.flags.writeable = False
        return view

    @classmethod
    def from_files(cls, files: RetrievalFiles, item_ids: Sequence[str] | None = None) -> Retriever:
        """Build from an artifact's retrieval part, checking it (dims, rows, no NaN/Inf, index
        size and contents, and the item ids when given: the DIN's); every failure is an
        :class:`ArtifactError`."""
        section = files.config
        spec = RetrievalSpec.from_json(section.get("model", {}))
        try:
            tensors = np_load(files.weights)
        except Exception as exc:  # safetensors raises its own error types
            raise ArtifactError(f"{RETRIEVAL_FILE} is not valid safetensors: {exc}") from exc
        ids = _decode_ids(tensors.get("item_ids"))
        if item_ids is not None and list(item_ids) != ids:
            raise ArtifactError(
                f"{RETRIEVAL_FILE}: its {len(ids)} item ids are not the artifact's {len(item_ids)} "
                "item ids in the same order"
            )
        rows, d, h = len(ids), spec.dim, spec.hidden
        shapes = {"item": (rows, d), "category": (rows,), "empty": (d,), USER_WEIGHTS[0]: (h, 2 * d),
                  USER_WEIGHTS[1]: (h,), USER_WEIGHTS[2]: (d, h), USER_WEIGHTS[3]: (d,)}  # fmt: skip
        for name, shape in shapes.items():
            got = tensors.get(name)
            if got is None or got.shape != shape:
                found = "missing" if got is None else f"{list(got.shape)}"
                raise ArtifactError(
                    f"{RETRIEVAL_FILE}: tensor {name!r} is {found}, expected {list(shape)} "
                    f"({rows} item ids, dim {d}, hidden {h})"
                )
            if name != "category" and (got.dtype != np.float32 or not np.isfinite(got).all()):
                raise ArtifactError(f"{RETRIEVAL_FILE}: tensor {name!r} is not finite float32")
        vocab = [str(c) for c in section.get("categories", [])]
        codes = tensors["category"].astype(np.int64)
        if codes.size and (codes.min() < -1 or codes.max() >= len(vocab)):
            raise ArtifactError(f"{RETRIEVAL_FILE}: category codes outside the vocabulary")
        index = AnnIndex.from_bytes(files.index, section.get("index", {}), rows=rows, dim=d)
        _spot_check(index, tensors["item"])
        return cls(
            item_ids=ids,
            categories=[vocab[c] if c >= 0 else "" for c in codes.tolist()],
            vectors=_shared(index, tensors["item"]),
            empty=tensors["empty"],
            weights={k: tensors[k] for k in USER_WEIGHTS},
            index=index,
            history_len=spec.history_len,
        )


def _encode_ids(item_ids: Sequence[str]) -> npt.NDArray[np.uint8]:
    """Item ids as one UTF-8 byte tensor, one id per line (ids hold no control characters)."""
    return np.frombuffer("".join(f"{i}\n" for i in item_ids).encode(), dtype=np.uint8)


def _decode_ids(raw: npt.NDArray[Any] | None) -> list[str]:
    if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
        raise ArtifactError(f"{RETRIEVAL_FILE}: tensor 'item_ids' is missing or not uint8 [bytes]")
    try:
        return raw.tobytes().decode("utf-8").split("\n")[:-1]
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{RETRIEVAL_FILE}: tensor 'item_ids' is not UTF-8: {exc}") from exc


def _shared(index: AnnIndex, vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The index's own copy of ``vectors`` when it stores exactly them (flat, HNSW): a large
    catalogue's vectors are then held once, not twice."""
    view = stored_vectors(index.index)
    return view if view is not None and np.array_equal(view, vectors) else vectors


def _spot_check(index: AnnIndex, vectors: npt.NDArray[np.float32], samples: int = 8) -> None:
    """The index holds these vectors: a few rows read back from it (flat and HNSW storage)."""
    if index.kind == "ivf" or len(vectors) == 0:
        return
    for row in (
        np.linspace(0, len(vectors) - 1, num=min(samples, len(vectors))).astype(int).tolist()
    ):
        if not np.array_equal(index.index.reconstruct(row), vectors[row]):
            raise ArtifactError(
                f"the retrieval index does not hold the item vectors (row {row} differs): it was "
                "built from another model"
            )


def retrieval_files(
    model: TwoTower,
    *,
    item_ids: Sequence[str],
    primary_category: npt.NDArray[np.int64],
    categories: Sequence[str],
    item_counts: npt.NDArray[np.int64],
    options: IndexOptions,
    train: Mapping[str, Any],
) -> tuple[RetrievalFiles, Retriever]:
    """Materialise a trained model into its artifact part and build the index over its item
    vectors. ``primary_category [N]``: each item's code in ``categories`` (-1 unknown)."""
    vectors = model.item_table()  # [N, D]
    empty = popularity_direction(vectors, item_counts)  # [D]
    index, meta = build_index(vectors, options)
    raw_index = index_bytes(index)
    meta["bytes"] = len(raw_index)
    weights = model.user_weights()
    tensors: dict[str, npt.NDArray[Any]] = {"item_ids": _encode_ids(item_ids), "item": vectors,
               "category": primary_category.astype(np.int64), "empty": empty, **weights}  # fmt: skip
    config = {
        "model": model.spec.to_json(),
        "rows": int(vectors.shape[0]),
        "dim": int(vectors.shape[1]),
        "categories": list(categories),
        "empty_history": "popularity direction (normalised count-weighted sum of the item vectors)",
        "index": meta,
        "index_options": options.to_json(),
        "train": dict(train),
    }
    files = RetrievalFiles(config=config, weights=np_save(tensors), index=raw_index)
    retriever = Retriever(
        item_ids=item_ids,
        categories=[categories[c] if c >= 0 else "" for c in primary_category.tolist()],
        vectors=vectors,
        empty=empty,
        weights=weights,
        index=AnnIndex(index, meta, nbytes=len(raw_index)),
        history_len=model.spec.history_len,
    )
    return files, retriever
