"""The approximate nearest-neighbour index over a version's item vectors (faiss, inner product).

The kind follows the catalogue's size (:func:`resolve_kind`): up to ``flat_max_rows`` rows an
exact ``IndexFlatIP`` (a brute-force scan is fast enough there and has perfect recall); above
it ``IndexHNSWFlat`` (a graph: search cost grows with log(rows), recall tuned by ``ef_search``)
or ``IndexIVFFlat`` (k-means lists: ``ivf_lists`` cells, ``ivf_probe`` scanned per search).
The index is built once, when the artifact is exported, and shipped with the version as
faiss' own binary serialisation (no pickle); the search parameters travel in config.json.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import faiss
import numpy as np
import numpy.typing as npt

from streamrank.errors import ArtifactError

IndexKind = Literal["auto", "flat", "hnsw", "ivf"]
INDEX_KINDS: tuple[IndexKind, ...] = ("auto", "flat", "hnsw", "ivf")


@dataclass(frozen=True)
class IndexOptions:
    """How the index is built and searched (docs/model.md, "Retrieval")."""

    kind: IndexKind = "auto"
    flat_max_rows: int = 200_000  # auto: exact search up to this many rows, else ``large``
    large: Literal["hnsw", "ivf"] = "hnsw"
    hnsw_m: int = 32  # graph links per node (memory ~ 2 * m * 4 bytes per row on top of vectors)
    hnsw_ef_construction: int = 80
    hnsw_ef_search: int = 128  # raised to n when a search asks for more results
    ivf_lists: int = 0  # 0: 4 * sqrt(rows)
    ivf_probe: int = 256
    ivf_train_rows: int = 0  # k-means on a seeded sample of this many rows (0: 64 per list)
    seed: int = 17

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def resolve_kind(rows: int, options: IndexOptions) -> Literal["flat", "hnsw", "ivf"]:
    """The kind of index to build for ``rows`` vectors."""
    if options.kind != "auto":
        return options.kind
    return "flat" if rows <= options.flat_max_rows else options.large


def build_index(
    vectors: npt.NDArray[np.float32], options: IndexOptions
) -> tuple[faiss.Index, dict[str, Any]]:
    """An inner-product index over ``vectors [rows, dim]`` (row i = label i), and what
    config.json records about it (kind, search parameters, build time)."""
    x = np.ascontiguousarray(vectors, dtype=np.float32)  # [N, D]
    rows, dim = x.shape
    kind = resolve_kind(rows, options)
    started = time.perf_counter()
    meta: dict[str, Any] = {"kind": kind, "rows": int(rows), "dim": int(dim)}
    if kind == "flat":
        index: faiss.Index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, options.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = options.hnsw_ef_construction
        meta |= {"m": options.hnsw_m, "ef_construction": options.hnsw_ef_construction,
                 "ef_search": options.hnsw_ef_search}  # fmt: skip
    elif kind == "ivf":
        lists = options.ivf_lists or max(1, min(rows, int(4 * math.sqrt(rows))))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, lists, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = options.seed
        rng = np.random.default_rng(options.seed)
        take = min(rows, max(options.ivf_train_rows or 64 * lists, lists))
        sample = x[np.sort(rng.choice(rows, size=take, replace=False))] if take < rows else x
        index.train(sample)
        meta |= {"lists": lists, "probe": min(options.ivf_probe, lists)}
    else:
        raise ValueError(f"index kind {kind!r}: use one of {', '.join(INDEX_KINDS)}")
    index.add(x)
    meta["build_seconds"] = round(time.perf_counter() - started, 3)
    return index, meta


def index_bytes(index: faiss.Index) -> bytes:
    """faiss' binary serialisation of ``index``."""
    return bytes(faiss.serialize_index(index))


class AnnIndex:
    """A loaded index with its search parameters: top-n rows by inner product."""

    def __init__(self, index: faiss.Index, meta: dict[str, Any], *, nbytes: int = 0) -> None:
        self.index = index
        self.kind = str(meta["kind"])
        # the serialised size: the vectors, lists or graph the index holds in memory
        self.nbytes = nbytes or len(index_bytes(index))
        self._ef = int(meta.get("ef_search", 0))
        if self.kind == "ivf":
            faiss.extract_index_ivf(index).nprobe = int(meta["probe"])

    @classmethod
    def from_bytes(cls, data: bytes, meta: dict[str, Any], *, rows: int, dim: int) -> AnnIndex:
        """Deserialise and check an index against the vectors it must hold."""
        kind = meta.get("kind")
        if kind not in ("flat", "hnsw", "ivf"):
            raise ArtifactError(f"retrieval index kind {kind!r} is not one of flat, hnsw, ivf")
        try:
            index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        except RuntimeError as exc:  # faiss reports every read failure as RuntimeError
            raise ArtifactError(f"the retrieval index does not load: {_first_line(exc)}") from exc
        if index.ntotal != rows or index.d != dim:
            raise ArtifactError(
                f"the retrieval index holds {index.ntotal} vectors of dim {index.d}; the item "
                f"vectors are {rows} x {dim}"
            )
        if index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise ArtifactError("the retrieval index does not rank by inner product")
        return cls(index, meta, nbytes=len(data))

    def search(
        self, users: npt.NDArray[np.float32], n: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """``users [B, D]`` -> rows ``[B, n]`` (-1 padded) and scores ``[B, n]`` (-inf padded),
        best first. One user at a time: faiss computes a batch of queries differently from a
        single one (BLAS above a batch size), and a user's results must not depend on the
        batch it came in (online = offline)."""
        q = np.ascontiguousarray(users, dtype=np.float32)  # [B, D]
        params = None
        if self.kind == "hnsw":
            params = faiss.SearchParametersHNSW(efSearch=max(self._ef, n))  # type: ignore[attr-defined]
        rows = np.empty((q.shape[0], n), dtype=np.int64)  # [B, n]
        scores = np.empty((q.shape[0], n), dtype=np.float32)  # [B, n]
        for b in range(q.shape[0]):
            scores[b : b + 1], rows[b : b + 1] = self.index.search(q[b : b + 1], n, params=params)
        scores[rows < 0] = -np.inf
        return rows, scores


def stored_vectors(index: faiss.Index) -> npt.NDArray[np.float32] | None:
    """A read-only view of the vectors a flat or HNSW index stores (row i = label i), without a
    copy; None for other kinds. Valid while ``index`` lives."""
    flat = faiss.downcast_index(index.storage) if isinstance(index, faiss.IndexHNSWFlat) else index
    if not isinstance(flat, faiss.IndexFlat) or flat.ntotal == 0:
        return None
    view = faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)
    view.flags.writeable = False
    return view


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__
