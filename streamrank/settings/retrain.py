"""The retrain loop's settings: what it exports, how it trains, its offline gate, where it
keeps datasets (``streamrank retrain``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrank.settings.base import Section


class RetrainSettings(Section):
    """One cycle: export the served log -> train (warm start) -> gate -> publish -> rollout."""

    env_prefix = "STREAMRANK_RETRAIN_"

    lookback_h: float = Field(
        168.0, gt=0, description="Hours of served log a cycle exports (ending now)."
    )
    holdout_share: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Latest share of the exported requests held out for the gate (not trained on).",
    )
    epochs: int = Field(2, ge=0, description="Training epochs per cycle over the exported data.")
    lr: float = Field(5e-4, gt=0, description="Learning rate of a cycle's training (Adam).")
    negatives: int = Field(
        4,
        ge=0,
        description="Non-clicked items trained on per clicked one, drawn from each request "
        "(0: all of them).",
    )
    warm_start: bool = Field(
        True, description="Start from the active version's weights (false: from scratch)."
    )
    incremental: bool = Field(
        True,
        description="Train only on requests served after the ones the active version was "
        "trained on (false: the whole exported window).",
    )
    gate_metric: Literal["gauc", "auc", "hr@10"] = Field(
        "gauc", description="Held-out metric the candidate must not be worse on."
    )
    gate_tolerance: float = Field(
        0.0, ge=0, description="How much lower than the active version's the metric may be."
    )
    gate_min_samples: int = Field(
        200,
        ge=1,
        description="Fewest held-out requests a cycle trains and gates on (fewer: skipped).",
    )
    dataset_dir: str = Field("datasets", description="Where cycles write their exported datasets.")
