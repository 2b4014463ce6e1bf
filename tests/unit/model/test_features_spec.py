"""The feature spec: its JSON round trip, the one transform of raw values, and the inputs a
worker cannot serve."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.model.din import ModelSpec, features_of
from scoring.model.features import (
    AGE_BUCKETS,
    FAMILIES,
    FeatureSpec,
    check_servable,
    dense_counters,
    parse_families,
    time_codes,
    user_codes,
)
from streamrank.errors import ArtifactError
from streamrank.settings import Settings

SPEC = FeatureSpec(
    families=FAMILIES,
    windows={"1h": 300, "24h": 3600},
    context_keys={"device": ("ios", "android")},
    user_attributes={"age": AGE_BUCKETS, "gender": ("F", "M")},
)


def test_spec_round_trips_and_names_its_inputs() -> None:
    assert FeatureSpec.from_json(SPEC.to_json(), default_length=7) == SPEC
    assert FeatureSpec.from_json(None, default_length=7) == FeatureSpec(sequence_length=7)
    assert [n for n, _ in SPEC.categorical] == [
        "hour_of_day", "day_of_week", "context.device", "user.age", "user.gender",
    ]  # fmt: skip
    assert [n for _, n in SPEC.categorical] == [24, 7, 3, 8, 3]
    assert parse_families("counters, sequence") == ("sequence", "counters")
    with pytest.raises(ValueError, match="unknown feature families"):
        parse_families("sequence,clicks")
    with pytest.raises(ArtifactError, match="not servable"):
        FeatureSpec.from_json({**SPEC.to_json(), "families": ["counters"]}, default_length=1)


def test_raw_values_become_codes_and_dense_inputs() -> None:
    # 2023-11-14 22:13:20 UTC was a Tuesday
    assert time_codes([1_700_000_000_000]).tolist() == [[22, 1]]
    codes = user_codes(SPEC, 1_700_000_000_000, {"device": "android"}, {"age": "30", "gender": "X"})
    assert codes == [22, 1, 2, AGE_BUCKETS.index("25-34") + 1, 0]  # unknown gender -> 0
    assert user_codes(SPEC, 1_700_000_000_000, None, None)[2:] == [0, 0, 0]
    np.testing.assert_allclose(dense_counters([[0, 1, 9, -3]]), [np.log1p([0, 1, 9, 0])])


def test_a_worker_refuses_a_spec_it_cannot_serve() -> None:
    settings = Settings().with_env(STREAMRANK_COUNTER_BUCKET_S=300, STREAMRANK_SEQUENCE_LENGTH=50)
    check_servable(SPEC, settings.features)  # the windows and the length it was trained with
    other = settings.with_env(STREAMRANK_COUNTER_BUCKET_S=600)
    with pytest.raises(ArtifactError, match="input 'counters' was trained on 1h windows of 300 s"):
        check_servable(SPEC, other.features)
    short = settings.with_env(STREAMRANK_SEQUENCE_LENGTH=20)
    with pytest.raises(ArtifactError, match="input 'sequence' needs 50 events"):
        check_servable(SPEC, short.features)
    # a sequence-only spec has no windows to match
    check_servable(
        FeatureSpec(sequence_length=20), other.with_env(STREAMRANK_SEQUENCE_LENGTH=20).features
    )


def test_the_model_must_have_the_inputs_its_spec_names() -> None:
    config = {"feature_spec": {"inputs": SPEC.to_json()}, "train": {"history_len": 50}}
    sizes = tuple(n for _, n in SPEC.categorical)
    assert features_of(config, ModelSpec(categorical_sizes=sizes, dense_features=5)) == SPEC
    with pytest.raises(ArtifactError, match="do not match the model"):
        features_of(config, ModelSpec(categorical_sizes=sizes, dense_features=0))
