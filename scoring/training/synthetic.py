"""Synthetic click logs with planted interests, for the demo, scale tests and a learnability check.

Model of the world: ``n_items`` item ids (millions is fine: nothing is materialised per id
space, only the items that get clicked), split into ``n_clusters`` interest clusters (the item's
category; item ``i`` belongs to cluster ``i % n_clusters``). Within a cluster popularity is Zipf:
the ``r``-th most popular item of cluster ``c`` is ``c + n_clusters * r``. Each user has
``interests`` planted clusters with Dirichlet weights and draws every click from one of them.
A model that reads the history can tell which clusters a user likes; Popularity cannot. With
several interests per user, a candidate's relevance depends on which past events share its
cluster: DIN's attention picks those out, BaseModel's sum pooling blurs the interests together.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from scoring.training.data import Dataset, _build


def generate(
    *,
    n_users: int = 2000,
    n_items: int = 2_000_000,
    n_clusters: int = 50,
    interests: int = 5,
    events_per_user: tuple[int, int] = (20, 60),
    zipf_a: float = 1.3,
    seed: int = 7,
) -> Dataset:
    """A :class:`Dataset` of synthetic clicks (file order = time order, ids ``u{n}``/``i{n}``)."""
    if n_items < n_clusters or interests > n_clusters or n_users < 1:
        raise ValueError("need n_items >= n_clusters >= interests and n_users >= 1")
    rng = np.random.default_rng(seed)
    per_cluster = n_items // n_clusters
    lengths = rng.integers(events_per_user[0], events_per_user[1] + 1, size=n_users)  # [U]
    user_of = np.repeat(np.arange(n_users), lengths)  # [n]
    n = int(lengths.sum())
    # planted interests: `interests` distinct clusters per user, Dirichlet weights
    clusters = np.argsort(rng.random((n_users, n_clusters)), axis=1)[:, :interests]  # [U, k]
    weights = rng.dirichlet(np.ones(interests), size=n_users)  # [U, k]
    pick = (rng.random(n)[:, None] > np.cumsum(weights[user_of], axis=1)).sum(1)  # [n] in 0..k-1
    pick = np.minimum(pick, interests - 1)
    cluster = clusters[user_of, pick]  # [n]
    rank = (rng.zipf(zipf_a, size=n) - 1) % per_cluster  # [n] Zipf rank inside the cluster
    item = cluster + n_clusters * rank  # [n]
    # time: users start within a day, then one event every 1..600 s
    start = rng.integers(1_700_000_000, 1_700_086_400, size=n_users)
    gaps = rng.integers(1, 601, size=n)
    ts = np.empty(n, dtype=np.int64)
    bounds = np.r_[0, np.cumsum(lengths)]
    csum = np.cumsum(gaps)
    first = np.r_[0, csum[bounds[1:-1] - 1]]  # cumulative gap before each user's first event
    ts[:] = start[user_of] + csum - np.repeat(first, lengths)
    order = np.argsort(ts, kind="stable")  # the log is in time order, like a real click log
    users = [f"u{u}" for u in user_of[order].tolist()]
    items = [f"i{i}" for i in item[order].tolist()]
    genre_lists = {f"i{i}": [f"c{i % n_clusters}"] for i in np.unique(item).tolist()}
    params = dict(n_users=n_users, n_items=n_items, n_clusters=n_clusters, interests=interests,
                  events_per_user=list(events_per_user), zipf_a=zipf_a, seed=seed)  # fmt: skip
    sha = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()
    return _build("synthetic", users, items, ts[order].tolist(), genre_lists, sha, {})
