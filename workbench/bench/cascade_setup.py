"""The setup of ``streamrank bench cascade`` (:mod:`workbench.bench.cascade`): a catalogue,
its model version with a retrieval part, published through the real path, the users'
sequences and a day of item clicks for the hot-item pool.

Two catalogues:

* ``ml-100k``: MovieLens-100K's 1,682 items (primary genre = category) and its 943 users'
  latest events as their sequences. The model is ``--artifact DIR`` (one written by
  ``streamrank train``, with its retrieval part) when given, else random weights over that
  catalogue (a random DIN and a random two-tower, flat index): latency does not depend on
  what the weights learnt, and the setup takes seconds instead of a training run.
* ``synthetic``: ``--items`` ids ``i<n>`` in 18 categories, random DIN and two-tower weights
  (unit item vectors), Zipf histories. The index kind is ``--index`` (above the flat limit
  the default here is IVF: its build takes ~30 s at 1M items, HNSW's ~3 min on 2 cores).
"""

from __future__ import annotations

import argparse
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from streamrank import clock
from streamrank.errors import StreamrankError
from streamrank.redis.client import used_memory
from streamrank.settings import Settings
from workbench.bench.loadgen import zipf_ids

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from scoring.model.artifact import Artifact

logger = logging.getLogger(__name__)

SYNTHETIC_CATEGORIES = 18
SEQUENCE_START_MS = 10**6  # sequences end this long before the run: every request sees them


@dataclass
class Catalogue:
    """Items, their categories and popularity, and the run's users with their histories."""

    name: str
    item_ids: list[str]
    genres: list[str]  # category vocabulary
    item_genres: npt.NDArray[np.int64]  # [N, G] codes into genres
    genre_mask: npt.NDArray[np.bool_]  # [N, G]
    primary: npt.NDArray[np.int64]  # [N] primary category code (-1: none)
    counts: npt.NDArray[np.int64]  # [N] clicks per item (the empty history's direction)
    histories: dict[str, list[str]] = field(default_factory=dict)  # user -> ids, oldest first


def ml100k_catalogue(settings: Settings, history: int, tag: str) -> Catalogue:
    """MovieLens-100K's items and each user's latest ``history`` events (user ids private to
    the run)."""
    from scoring.training.data import load_movielens, time_order
    from scoring.training.twotower import primary_categories
    from workbench.datasets import MOVIELENS_100K, find_dataset

    folder = find_dataset(settings.tools, MOVIELENS_100K)
    if folder is None:
        raise StreamrankError(
            "MovieLens-100K not found (data_dir or data_cache_dir); run `streamrank data fetch "
            "movielens`, set STREAMRANK_DATA_DIR, or use --catalogue synthetic"
        )
    ds = load_movielens(folder)
    histories: dict[str, list[str]] = {}
    for row in time_order(ds).tolist():
        histories.setdefault(f"c{tag}-{ds.user_ids[row]}", []).append(ds.items[ds.item_index[row]])
    histories = {u: h[-history:] for u, h in histories.items()}
    return Catalogue(
        name="ml-100k",
        item_ids=list(ds.items),
        genres=list(ds.genres),
        item_genres=ds.item_genres.astype(np.int64),
        genre_mask=ds.genre_mask,
        primary=primary_categories(ds),
        counts=np.bincount(ds.item_index, minlength=len(ds.items)).astype(np.int64),
        histories=histories,
    )


def synthetic_catalogue(
    n_items: int, *, users: int, history: int, zipf: float, seed: int, tag: str
) -> Catalogue:
    """``n_items`` ids ``i<n>`` (item 0 the most popular), a random category each, and
    ``users`` Zipf histories of ``history`` items."""
    rng = np.random.default_rng(seed)
    primary = rng.integers(0, SYNTHETIC_CATEGORIES, size=n_items).astype(np.int64)
    picks = zipf_ids(rng, users * history, n_items=n_items, a=zipf).reshape(users, history)
    weights = 1.0 / np.arange(1, n_items + 1, dtype=np.float64) ** zipf
    return Catalogue(
        name="synthetic",
        item_ids=[f"i{n}" for n in range(n_items)],
        genres=[f"c{k}" for k in range(SYNTHETIC_CATEGORIES)],
        item_genres=primary[:, None].copy(),
        genre_mask=np.ones((n_items, 1), dtype=bool),
        primary=primary,
        counts=np.round(weights / weights.sum() * 10 * n_items).astype(np.int64),
        histories={f"c{tag}-u{u}": [f"i{int(x)}" for x in picks[u]] for u in range(users)},
    )


def index_options(kind: str | None, rows: int) -> Any:
    """The index to build: ``kind`` when given; else exact up to the flat limit, IVF above."""
    from scoring.model.ann import IndexOptions

    if kind is not None:
        return IndexOptions(kind=kind)  # type: ignore[arg-type]
    return IndexOptions(kind="auto", large="ivf")


def random_artifact(
    catalogue: Catalogue, *, index: str | None, seed: int, workdir: Path, version: str
) -> tuple[Path, dict[str, Any]]:
    """A random-weight DIN (int8 item table) and two-tower with its index, saved as an
    artifact; returns its path and the index build figures."""
    import torch

    from scoring.model.artifact import save_artifact
    from scoring.model.din import DIN, ModelSpec, dense_state
    from scoring.model.retrieval import RetrievalSpec, TwoTower, retrieval_files

    n_items = len(catalogue.item_ids)
    spec = ModelSpec()
    torch.manual_seed(seed)
    net = DIN(spec)
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((n_items, spec.item_dim), dtype=np.float32) * 0.3).astype(
        np.float32
    )
    towers = TwoTower(
        RetrievalSpec(), n_items=n_items, item_genres=torch.from_numpy(catalogue.item_genres),
        genre_mask=torch.from_numpy(catalogue.genre_mask), n_genres=len(catalogue.genres),
    )  # fmt: skip
    started = time.perf_counter()
    files, retriever = retrieval_files(
        towers, item_ids=catalogue.item_ids, primary_category=catalogue.primary,
        categories=catalogue.genres, item_counts=catalogue.counts,
        options=index_options(index, n_items), train={"note": "random weights", "seed": seed},
    )  # fmt: skip
    built = round(time.perf_counter() - started, 1)
    path = save_artifact(
        workdir, spec=spec, dense_state=dense_state(net), item_ids=catalogue.item_ids,
        item_table=table, oov_row=np.zeros(spec.item_dim, dtype=np.float32), encoding="int8",
        feature_spec={"synthetic": True}, data={"synthetic": {"catalogue": catalogue.name}},
        metrics={}, train={"note": "random weights: a latency benchmark, not a trained model"},
        version=version, retrieval=files,
    )  # fmt: skip
    meta = files.config["index"]
    return path, {
        "kind": meta["kind"],
        "rows": meta["rows"],
        "build_s": meta["build_seconds"],
        "materialise_and_build_s": built,
        "bytes": meta["bytes"],
        "params": {k: meta[k] for k in ("lists", "probe", "m", "ef_search") if k in meta},
        "retriever_memory_bytes": retriever.memory_bytes(),
    }


def trained_index(artifact: Artifact) -> dict[str, Any]:
    """The index figures a trained artifact's config records."""
    if artifact.retrieval is None:
        raise StreamrankError(
            f"artifact {artifact.path} has no retrieval model; train with retrieval or leave "
            "out --artifact"
        )
    meta = artifact.retrieval.config["index"]
    return {
        "kind": meta["kind"],
        "rows": meta["rows"],
        "build_s": meta.get("build_seconds"),
        "bytes": meta.get("bytes", len(artifact.retrieval.index)),
        "params": {k: meta[k] for k in ("lists", "probe", "m", "ef_search") if k in meta},
        "retriever_memory_bytes": artifact.retriever().memory_bytes(),
    }


async def publish(redis: aioredis.Redis, artifact: Artifact) -> dict[str, Any]:
    """Publish through the real path; the seconds and the Redis memory the version took."""
    from scoring.model.registry import publish_artifact

    before = await used_memory(redis)
    started = time.perf_counter()
    await publish_artifact(redis, artifact, progress=True)
    return {
        "publish_s": round(time.perf_counter() - started, 1),
        "redis_model_bytes": await used_memory(redis) - before,
    }


async def store_sequences(redis: aioredis.Redis, catalogue: Catalogue) -> dict[str, Any]:
    """The users' sequences in Redis (ending before the run); their memory."""
    from workbench.bench.scoring import write_sequences

    before = await used_memory(redis)
    await write_sequences(redis, catalogue.histories, start_ms=clock.now_ms() - SEQUENCE_START_MS)
    used = await used_memory(redis) - before
    return {"users": len(catalogue.histories),
            "redis_bytes_per_user": round(used / max(1, len(catalogue.histories)), 1)}  # fmt: skip


async def hot_clicks(
    redis: aioredis.Redis, catalogue: Catalogue, settings: Settings, *, clicks: int, seed: int
) -> dict[str, Any]:
    """A Zipf day of ``clicks`` item clicks before now in the item counter buckets (the hot
    pool's source), then one hot-pool read and refreshes of the pool's window as of now
    (:mod:`workbench.bench.hotpool`): ms, bytes, memory held."""
    from streams.windows import windows_from_settings
    from workbench.bench.hotpool import one_window, populate

    as_of = clock.now_ms()
    ns = argparse.Namespace(items=len(catalogue.item_ids), clicks=clicks, zipf=1.0, seed=seed,
                            pool=settings.cascade.hot_pool, refreshes=5, resync=2)  # fmt: skip
    fine, coarse = windows_from_settings(settings.features)
    window = coarse if settings.cascade.hot_window == coarse.name else fine
    before = await used_memory(redis)
    started = time.perf_counter()
    fields = await populate(redis, ns, fine, coarse, as_of_ms=as_of, names=catalogue.item_ids)
    out: dict[str, Any] = {
        "clicks_per_day": clicks,
        "bucket_fields": fields,
        "populate_s": round(time.perf_counter() - started, 1),
        "redis_bytes": await used_memory(redis) - before,
        "window": window.name,
    }
    measured = await one_window(redis, ns, settings, window, as_of_ms=as_of)
    out["whole_read_ms"] = measured["full"]["ms"]
    out["incremental"] = measured["incremental"]
    return out


def run_tag() -> str:
    return uuid.uuid4().hex[:8]
