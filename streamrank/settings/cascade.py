"""The ranking cascade's settings: stage widths, per-stage budgets, scene rules, result cache."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from streamrank.settings.base import Section


class SceneRule(BaseModel):
    """What the filter and rerank stages do for one scene."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    filter_seen: bool = Field(True, description="Drop items already in the user's sequence.")
    category_cap: int = Field(
        0, ge=0, description="Most items of one category in a reply (0 = no cap)."
    )
    top_k: int | None = Field(None, ge=1, description="Reply length when a request has none.")


def _json_object(value: Any) -> Any:
    """A scene table written in the environment as a JSON object."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ValueError(
                f"expected a JSON object such as "
                f'{{"home": {{"category_cap": 3, "filter_seen": true}}}}, got {text[:60]!r} ({exc})'
            ) from None
    return value


SceneRules = Annotated[dict[str, SceneRule], BeforeValidator(_json_object)]


class CascadeSettings(Section):
    """Requests without candidates: retrieval -> filter -> coarse -> rank -> rerank.

    Widths go from wide to narrow (retrieve >= coarse >= rerank_window); budgets are each
    stage's share of ``budget_ms``, which leaves headroom for the queue and the reply."""

    env_prefix = "STREAMRANK_CASCADE_"

    retrieve: int = Field(
        1000, ge=1, description="Candidates the vector index returns per request (N)."
    )
    hot_pool: int = Field(
        500, ge=0, description="Items the hot-item pool keeps (the retrieval fallback)."
    )
    hot_merge: int = Field(
        0,
        ge=0,
        description="Hot-pool items merged into the index's candidates (0 = the pool is the "
        "fallback only; it is wall-clock state, so a replay of old events sets 0).",
    )
    hot_window: Literal["1h", "24h"] = Field(
        "24h", description="Which item click window ranks the hot-item pool."
    )
    hot_refresh_s: float = Field(
        5.0, gt=0, description="How often a scoring worker re-reads the hot-item pool."
    )
    coarse: int = Field(
        200,
        ge=1,
        le=500,
        description="Survivors of the coarse dot-product cut that the deep model ranks (M).",
    )
    rerank_window: int = Field(
        50, ge=1, description="Top of the deep model's order the reranker may reorder (K)."
    )
    top_k: int = Field(10, ge=1, description="Reply length of a retrieval request without top_k.")
    filter_seen: bool = Field(
        True, description="Default scene rule: drop items already in the user's sequence."
    )
    category_cap: int = Field(
        0, ge=0, description="Default scene rule: most items of one category (0 = no cap)."
    )
    scenes: SceneRules = Field(
        default_factory=dict,
        description='Per-scene rules as JSON, e.g. {"home": {"category_cap": 3}}; a scene '
        "not listed uses the default rule.",
    )
    budget_ms: int = Field(100, ge=1, description="Deadline of a retrieval request that has none.")
    budget_retrieval_ms: float = Field(15.0, gt=0, description="Retrieval stage budget.")
    budget_filter_ms: float = Field(5.0, gt=0, description="Filter stage budget.")
    budget_coarse_ms: float = Field(10.0, gt=0, description="Coarse stage budget.")
    budget_rank_ms: float = Field(40.0, gt=0, description="Deep-model (rank) stage budget.")
    budget_rerank_ms: float = Field(10.0, gt=0, description="Rerank stage budget.")
    result_cache: Literal["local", "redis", "off"] = Field(
        "local",
        description="Where final results are cached: this worker's LRU, Redis (shared by the "
        "group), or off.",
    )
    result_cache_ttl_s: float = Field(
        30.0, gt=0, description="How long a cached result may be served."
    )
    result_cache_entries: int = Field(
        50_000, ge=1, description="Most results the local result cache holds."
    )

    def rule(self, scene: str) -> SceneRule:
        """The scene's rule, else the default one."""
        found = self.scenes.get(scene)
        if found is not None:
            return found
        return SceneRule(filter_seen=self.filter_seen, category_cap=self.category_cap)

    def budgets_ms(self) -> dict[str, float]:
        """Each stage's budget, in the order the stages run."""
        return {
            "retrieval": self.budget_retrieval_ms,
            "filter": self.budget_filter_ms,
            "coarse": self.budget_coarse_ms,
            "rank": self.budget_rank_ms,
            "rerank": self.budget_rerank_ms,
        }
