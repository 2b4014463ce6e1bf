"""The offline replay of rollouts through the guard (``bench rollout``'s simulation)."""

from __future__ import annotations

import numpy as np

from workbench.bench.rollout_sim import simulate_rollouts


def test_simulated_rollouts_roll_back_a_random_ranker_and_promote_an_equal_one() -> None:
    rng = np.random.default_rng(4)
    users, items = 300, 10
    positives = rng.integers(0, items, size=users)
    good = rng.random((users, items)) * 0.5
    good[np.arange(users), positives] += 0.4  # the clicked item usually ranks first
    bad = rng.random((users, items))
    kw = {"runs": 6, "steps": (20, 50, 100), "min_outcomes": 40, "guard": "auc:0.01",
          "hold_requests": 100, "tick_requests": 30}  # fmt: skip
    worse = simulate_rollouts(good, bad, positives.tolist(), **kw)  # type: ignore[arg-type]
    assert worse["rolled_back"] == 6
    same = simulate_rollouts(good, good.copy(), positives.tolist(), **kw)  # type: ignore[arg-type]
    assert same["promoted"] == 6 and same["requests_per_run_median"] > 0
