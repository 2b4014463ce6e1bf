from workbench.bench.soak_capacity import LAG_SLACK_S, keeps_up


def test_a_group_keeps_up_while_its_lag_stays_within_seconds_of_its_offered_rate() -> None:
    rates = {"click_rate": 1000.0, "request_rate": 100.0}
    assert keeps_up({"features": 0, "scoring": 0}, **rates)
    limit = {"features": int(1000 * LAG_SLACK_S), "scoring": int(100 * LAG_SLACK_S)}
    assert keeps_up(limit, **rates)
    assert not keeps_up({**limit, "features": limit["features"] + 1}, **rates)
    assert not keeps_up({**limit, "scoring": limit["scoring"] + 1}, **rates)
    # at low rates a batch or a commit interval in flight is not falling behind
    assert keeps_up({"features": 100, "scoring": 20}, click_rate=1.0, request_rate=1.0)
