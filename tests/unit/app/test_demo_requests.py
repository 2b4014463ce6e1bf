from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np

from workbench.demo import CANDIDATES, rank_requests


def test_demo_traffic_mixes_candidate_requests_and_retrieval_requests() -> None:
    items = [f"i{n}" for n in range(100)]
    ds = SimpleNamespace(user_ids=np.array(["u1", "u2", "u3"]), items=items)
    requests = list(itertools.islice(rank_requests(ds, seed=3), 40))
    retrieval = [r for r in requests if r.retrieves]
    scored = [r for r in requests if not r.retrieves]
    assert len(retrieval) == len(scored) == 20
    assert all(r.top_k == 10 and r.items == () for r in retrieval)
    assert all(len(r.items) == len(set(r.items)) == CANDIDATES for r in scored)
    assert {r.user_id for r in requests} <= {"u1", "u2", "u3"}
    assert len({r.request_id for r in requests}) == 40


async def test_the_watch_says_when_redis_does_not_answer_and_goes_on(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from streamrank.redis.client import redis_client
    from streamrank.settings import Settings
    from workbench.demo import _show_features
    from workbench.devstack.services import free_port

    monkeypatch.setenv("STREAMRANK_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    settings = Settings()
    redis = redis_client(settings.redis)
    try:
        await _show_features(settings, redis, "u1")  # nothing listens there: refused
    finally:
        await redis.aclose()
    out = capsys.readouterr().out
    assert out.startswith("features: user u1: no read (Redis did not answer the feature read"), out


def test_the_watched_user_clicks_within_the_first_tenth_of_the_window() -> None:
    from scoring.training.data import time_order
    from scoring.training.synthetic import generate
    from workbench.demo import pick_user_and_items

    ds = generate(n_users=300, n_items=2000, seed=5)
    user, items, positives = pick_user_and_items(ds, horizon=6000, max_events=50)
    rows = time_order(ds)[:6000]
    mine = np.flatnonzero(ds.user_ids[rows] == user)
    assert mine[0] < 600, "the sequence must start filling in the watch's first seconds"
    assert 5 <= len(mine) <= 50
    assert len(items) == len(set(items)) == CANDIDATES and positives <= set(items)
