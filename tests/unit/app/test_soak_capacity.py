from workbench.bench.soak_capacity import LAG_SLACK_S, keeps_up, served


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
