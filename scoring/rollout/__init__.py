"""Model rollout by evidence: served results joined with later clicks (the outcomes worker),
online metrics per model version with intervals, and the staged rollout with its guard."""
