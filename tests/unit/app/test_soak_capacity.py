from workbench.bench.drive import Run
from workbench.bench.soak_capacity import (
    LAG_SLACK_S,
    WARMUP_SHARE,
    keeps_up,
    p99_after_warmup,
    served,
    within_budget,
)


def test_a_group_keeps_up_while_its_lag_stays_within_seconds_of_its_offered_rate() -> None:
    rates = {"click_rate": 1000.0, "request_rate": 100.0, "probe_s": 30.0}
    assert keeps_up({"features": 0, "scoring": 0}, **rates)
    limit = {"features": int(1000 * LAG_SLACK_S), "scoring": int(100 * LAG_SLACK_S)}
    assert keeps_up(limit, **rates)
    assert not keeps_up({**limit, "features": limit["features"] + 1}, **rates)
    assert not keeps_up({**limit, "scoring": limit["scoring"] + 1}, **rates)
    # at low rates a batch or a commit interval in flight is not falling behind
    assert keeps_up(
        {"features": 100, "scoring": 20}, click_rate=1.0, request_rate=1.0, probe_s=30.0
    )


def test_a_short_probe_allows_a_tenth_of_its_length_behind() -> None:
    rates = {"click_rate": 1000.0, "request_rate": 100.0, "probe_s": 8.0}
    assert keeps_up({"features": 800, "scoring": 80}, **rates)
    assert not keeps_up({"features": 800, "scoring": 81}, **rates)
    assert not keeps_up({"features": 801, "scoring": 0}, **rates)


def test_a_probe_whose_replies_are_mostly_expired_did_not_keep_up() -> None:
    assert served(replies=1000, degraded=10)
    assert not served(replies=1000, degraded=11)
    assert not served(replies=5411, degraded=1273)  # an overloaded worker expiring requests
    assert served(replies=0, degraded=0)


def test_a_probe_whose_p99_is_over_the_ranking_budget_did_not_keep_up() -> None:
    assert within_budget(50.0, budget_ms=50.0)
    assert not within_budget(50.01, budget_ms=50.0)
    assert not within_budget(3116.71, budget_ms=50.0)  # kept up only by queueing seconds
    assert not within_budget(None, budget_ms=50.0)  # nothing answered is not within budget


def test_the_p99_leaves_out_the_requests_sent_in_the_probes_warmup() -> None:
    seconds = 10.0
    warm_ms = int(WARMUP_SHARE * seconds * 1000)
    # one request every 10 ms from t=1000 ms: slow (900 ms) during the warm-up, 5-14 ms after
    requests = [{"request_id": f"r{n}", "sent_ms": 1000 + 10 * n} for n in range(1000)]
    replies = [{"request_id": r["request_id"],
                "latency_ms": 900.0 if r["sent_ms"] < 1000 + warm_ms else 5.0 + n % 10}
               for n, r in enumerate(requests)]  # fmt: skip
    run = Run(clicks=[], requests=requests, replies=replies)
    assert p99_after_warmup(run, seconds=seconds) == 14.0
    assert p99_after_warmup(Run(clicks=[], requests=[], replies=[]), seconds=seconds) is None
    unanswered = Run(clicks=[], requests=requests, replies=replies[: warm_ms // 10])
    assert p99_after_warmup(unanswered, seconds=seconds) is None  # only warm-up replies
