"""Reply routing, deadlines, error replies and fallback scores."""

from __future__ import annotations

import numpy as np

from schemas import RankRequest, decode_result, reasons
from scoring.serving import replies


def test_reply_topic_allows_only_the_default_and_the_allow_list() -> None:
    kw = {"default": "rank-results", "allowed": ("svc-a-replies",)}
    assert replies.reply_topic(None, **kw) == "rank-results"
    assert replies.reply_topic("rank-results", **kw) == "rank-results"
    assert replies.reply_topic("svc-a-replies", **kw) == "svc-a-replies"
    assert replies.reply_topic("clicks", **kw) is None


def test_deadline_is_the_requests_own_else_produced_plus_budget() -> None:
    req = RankRequest("r1", "u1", ("a",))
    assert replies.deadline_ms(req, produced_ms=1000, budget_ms=50) == 1050
    req2 = RankRequest("r1", "u1", ("a",), deadline_ms=5000)
    assert replies.deadline_ms(req2, produced_ms=1000, budget_ms=50) == 5000


def test_error_reply_follows_the_result_contract_and_is_recognised() -> None:
    result = replies.error_reply(
        "r9", "", reasons.INVALID_REQUEST, "empty_items: no items", now_ms=7
    )
    decoded = decode_result(result.to_json())
    assert decoded.request_id == "r9" and decoded.scores == () and decoded.degraded
    assert reasons.is_error_reply(decoded)
    degraded = replies.error_reply("r9", "u", reasons.EXPIRED, "late", now_ms=7)
    assert not reasons.is_error_reply(degraded)  # expired is degraded, not a refusal


def test_popularity_scores_are_monotone_bounded_and_per_item() -> None:
    scores = replies.popularity_scores(np.array([0, 1, 10, 1000, 5]))
    assert scores[0] == 0.0
    assert scores[1] < scores[4] < scores[2] < scores[3] < 1.0
    again = replies.popularity_scores(np.array([10]))
    assert again[0] == scores[2]
    assert replies.neutral_scores(3).tolist() == [0.5, 0.5, 0.5]
