"""The retriever: user vectors (deterministic, the same from the trained model and from the
artifact's bytes, whatever the batch), ANN search against brute force, rows and dot with
unknown ids, and the index kinds' recall on a random catalogue."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scoring.model.ann import AnnIndex, IndexOptions, build_index, resolve_kind
from scoring.model.retrieval import (
    RetrievalFiles,
    RetrievalSpec,
    Retriever,
    TwoTower,
    popularity_direction,
    retrieval_files,
)

SPEC = RetrievalSpec(dim=16, hidden=24, category_dim=4, history_len=5)


def make_retriever(
    rows: int = 60, *, seed: int = 0, options: IndexOptions | None = None
) -> tuple[Retriever, RetrievalFiles]:
    """A randomly initialised two-tower over ``rows`` items (3 genres, 1-2 per item)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    genres = rng.integers(0, 3, size=(rows, 2))
    mask = np.ones((rows, 2), dtype=bool)
    mask[::2, 1] = False
    model = TwoTower(SPEC, n_items=rows, item_genres=torch.from_numpy(genres),
                     genre_mask=torch.from_numpy(mask), n_genres=3)  # fmt: skip
    primary = np.where(np.arange(rows) % 7 == 0, -1, genres[:, 0]).astype(np.int64)
    files, retriever = retrieval_files(
        model,
        item_ids=[f"item-{i}" for i in range(rows)],
        primary_category=primary,
        categories=["Action", "Comedy", "Drama"],
        item_counts=rng.integers(0, 20, size=rows),
        options=options or IndexOptions(),
        train={"seed": seed},
    )
    return retriever, files


HISTORIES = [
    ["item-3", "item-9", "item-4"],
    ["item-1"],
    [],
    ["item-7", "nope", "item-2", "item-2", "item-50", "item-11", "item-12"],
]


def test_user_vectors_are_the_same_offline_online_and_in_any_batch() -> None:
    offline, files = make_retriever()
    online = Retriever.from_files(files, offline.item_ids)  # what a worker loads
    assert online.item_ids == offline.item_ids and online.dim == SPEC.dim
    batch = offline.user_vectors(HISTORIES)  # [4, D]
    assert batch.dtype == np.float32 and batch.shape == (4, SPEC.dim)
    np.testing.assert_array_equal(online.user_vectors(HISTORIES), batch)  # bitwise
    for i, history in enumerate(HISTORIES):  # alone, or with other users: the same bits
        np.testing.assert_array_equal(online.user_vectors([history])[0], batch[i])
    np.testing.assert_array_equal(online.user_vectors(HISTORIES[::-1]), batch[::-1])
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    # loaded, the vectors are the index's own copy: held once
    assert online.memory_bytes() == offline.memory_bytes() - offline.vectors.nbytes


def test_history_cut_unknown_ids_and_the_empty_history() -> None:
    r, _ = make_retriever()
    vec = r.user_vectors
    # only the last history_len (5) ids count; unknown ids are left out
    np.testing.assert_array_equal(
        vec([HISTORIES[3]])[0], vec([["item-2", "item-2", "item-50", "item-11", "item-12"]])[0]
    )
    np.testing.assert_array_equal(vec([["nope", "item-1", "gone"]])[0], vec([["item-1"]])[0])
    # no known id: the popularity direction, the same for every such user
    empty = vec([[], ["nope"]])
    np.testing.assert_array_equal(empty[0], empty[1])
    assert not np.array_equal(empty[0], vec([["item-1"]])[0])
    np.testing.assert_allclose(np.linalg.norm(empty[0]), 1.0, atol=1e-6)


def test_popularity_direction_weights_items_by_count() -> None:
    vectors = np.eye(3, dtype=np.float32)
    np.testing.assert_allclose(popularity_direction(vectors, np.array([0, 5, 0])), [0, 1, 0])
    np.testing.assert_allclose(
        popularity_direction(vectors, np.zeros(3, dtype=np.int64)), np.full(3, 3**-0.5), rtol=1e-6
    )


def test_rows_dot_and_categories() -> None:
    r, _ = make_retriever()
    np.testing.assert_array_equal(r.rows(["item-5", "nope", "item-0"]), [5, -1, 0])
    assert r.rows([]).shape == (0,) and r.rows([]).dtype == np.int64
    users = r.user_vectors(HISTORIES[:2])  # [2, D]
    rows = np.array([[5, -1, 0], [-1, -1, 59]])
    scores = r.dot(users, rows)  # [2, 3]
    assert scores.dtype == np.float32 and scores.shape == (2, 3)
    assert np.isneginf(scores[0, 1]) and np.isneginf(scores[1, :2]).all()
    np.testing.assert_allclose(scores[0, 0], users[0] @ r.vectors[5], rtol=1e-6)
    np.testing.assert_allclose(scores[1, 2], users[1] @ r.vectors[59], rtol=1e-6)
    assert r.categories[0] == "" and r.categories[1] in ("Action", "Comedy", "Drama")
    assert len(r.categories) == len(r.item_ids) == 60
    assert r.memory_bytes() > r.vectors.nbytes
    with pytest.raises(ValueError):
        r.vectors[0, 0] = 1.0  # read only


def test_search_agrees_with_brute_force_on_a_flat_index() -> None:
    r, _ = make_retriever()
    assert r.index.kind == "flat"
    users = r.user_vectors(HISTORIES)
    rows, scores = r.search(users, 10)  # [4, 10]
    assert rows.dtype == np.int64 and scores.dtype == np.float32 and rows.shape == (4, 10)
    exact = users @ r.vectors.T  # [4, 60]
    expected = np.argsort(-exact, axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(rows, expected)
    np.testing.assert_allclose(scores, np.take_along_axis(exact, expected, 1), rtol=1e-5)
    np.testing.assert_allclose(r.dot(users, rows), scores, rtol=1e-5, atol=1e-6)
    # more than the catalogue: padded with -1 rows and -inf scores, best first
    rows, scores = r.search(users[:1], 70)
    assert (rows[0, :60] >= 0).all() and (rows[0, 60:] == -1).all()
    assert np.isneginf(scores[0, 60:]).all() and (np.diff(scores[0, :60]) <= 0).all()


def test_the_index_kind_follows_the_catalogue_size() -> None:
    opts = IndexOptions(flat_max_rows=100)
    assert resolve_kind(100, opts) == "flat" and resolve_kind(101, opts) == "hnsw"
    assert resolve_kind(101, IndexOptions(flat_max_rows=100, large="ivf")) == "ivf"
    assert resolve_kind(5, IndexOptions(kind="hnsw")) == "hnsw"


@pytest.mark.parametrize(
    ("options", "floor"),
    [
        (IndexOptions(kind="hnsw", hnsw_ef_search=64), 0.95),
        (IndexOptions(kind="ivf", ivf_lists=64, ivf_probe=16), 0.6),
    ],
)
def test_ann_recall_on_a_random_catalogue(options: IndexOptions, floor: float) -> None:
    rng = np.random.default_rng(5)
    items = rng.normal(size=(20_000, 32)).astype(np.float32)
    items /= np.linalg.norm(items, axis=1, keepdims=True)
    users = rng.normal(size=(40, 32)).astype(np.float32)
    users /= np.linalg.norm(users, axis=1, keepdims=True)
    index, meta = build_index(items, options)
    ann = AnnIndex(index, meta)
    rows, _ = ann.search(users, 100)
    exact = np.argsort(-(users @ items.T), axis=1)[:, :100]
    recall = np.mean([len(set(a) & set(e)) / 100 for a, e in zip(rows, exact, strict=True)])
    assert recall >= floor, (options.kind, recall)


def test_search_results_do_not_depend_on_the_batch() -> None:
    r, _ = make_retriever(rows=300)
    users = r.user_vectors([[f"item-{i}", f"item-{2 * i}"] for i in range(40)])  # [40, D]
    rows, scores = r.search(users, 50)  # 40 queries: above faiss' BLAS threshold
    for b in (0, 17, 39):
        one_rows, one_scores = r.search(users[b : b + 1], 50)
        np.testing.assert_array_equal(one_rows[0], rows[b])
        np.testing.assert_array_equal(one_scores[0], scores[b])
