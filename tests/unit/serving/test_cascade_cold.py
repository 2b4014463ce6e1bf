"""The cascade's result cache keeps a reply's cold-start map: the served-log record of a cached
repeat names the items scored with a cold-start vector as the first reply's record did, in the
local LRU and through Redis (the JSON value)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from schemas import RankRequest
from scoring.model.coldstart import ColdStart
from scoring.serving.result_cache import CachedResult
from tests.unit.serving.test_cascade import ITEMS, SEQ, Rig, retriever, serving
from tests.unit.serving.test_service import DIM, Embeddings, Event, Features, MeanDotScorer

FRESH = "fresh"  # in the user's history, unknown to the version, with attributes


class ColdScorer(MeanDotScorer):
    cold_start = ColdStart(
        np.full(DIM - 2, 0.5, np.float32),
        np.array([[1.0, 0.0], [0.0, 1.0]], np.float32),
        {"drama": 0, "comedy": 1},
    )


class FoundEmbeddings(Embeddings):
    async def lookup_found(
        self, version: str, table: str, ids: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        return await self.lookup(version, table, ids), np.array([i in ITEMS for i in ids])


class AttributeFeatures(Features):
    async def item_attributes(self, item_ids: Sequence[str]) -> Mapping[str, Mapping[str, Any]]:
        return {i: {"category": "comedy|western"} for i in item_ids if i == FRESH}


async def test_a_cached_reply_logs_the_cold_start_map_of_the_reply_it_repeats() -> None:
    history = [*SEQ["u1"], Event(FRESH, 4, "e4")]
    features = AttributeFeatures({"u1": history}, {})
    rig = Rig(serving(retriever(), scorer=ColdScorer()), features=features,
              embeddings=FoundEmbeddings())  # fmt: skip
    first = await rig.one(RankRequest("r1", "u1"))
    assert not first.result.cached
    assert first.served["cold_start"] == {FRESH: ["comedy"]}
    again = await rig.one(RankRequest("r2", "u1"))
    assert again.result.cached and again.served["cached"] is True
    assert again.served["cold_start"] == {FRESH: ["comedy"]}
    assert list(again.result.scores) == list(first.result.scores)


def test_the_cold_start_map_survives_the_redis_value() -> None:
    stored = CachedResult("4:e4", ("i01",), (0.5,), None, {FRESH: ["comedy"]})
    assert CachedResult.from_json(stored.to_json()).cold_start == {FRESH: ["comedy"]}
