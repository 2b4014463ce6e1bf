"""Cold-start vectors: one definition, built from the categories in the version's vocabulary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scoring.model.coldstart import (
    CATEGORY_TABLE,
    NEW_ITEM_TABLE,
    ColdStart,
    attribute_categories,
    cold_start_from,
    cold_vectors,
)
from streamrank.errors import ArtifactError

VOCAB = ["Action", "Comedy", "Drama", "unknown"]
CONFIG = {"version": "v1", "feature_spec": {"category": {"vocabulary": VOCAB}}}


def parts(id_dim: int = 3, category_dim: int = 2) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {
        NEW_ITEM_TABLE: torch.randn(id_dim, generator=gen),
        CATEGORY_TABLE: torch.randn(len(VOCAB), category_dim, generator=gen),
    }


def test_a_cold_vector_is_the_new_item_vector_and_the_mean_of_its_categories() -> None:
    new_item = np.array([1.0, 2.0], dtype=np.float32)
    categories = np.array([[0.0, 2.0], [4.0, 6.0], [10.0, 10.0]], dtype=np.float32)
    out = cold_vectors(new_item, categories, [[0, 1], [2]])
    np.testing.assert_array_equal(out, [[1, 2, 2, 4], [1, 2, 10, 10]])
    assert out.dtype == np.float32


def test_categories_come_from_the_category_and_the_genres() -> None:
    value = {"category": "Action|Comedy", "attributes": {"genres": ["Comedy", "Sci-Fi"]}}
    assert attribute_categories(value) == ["Action", "Comedy", "Sci-Fi"]
    assert attribute_categories({"category": None, "attributes": {"genres": "Drama|War"}}) == [
        "Drama",
        "War",
    ]
    assert attribute_categories({"category": "Action|Comedy"}) == ["Action", "Comedy"]  # a load
    assert attribute_categories({"attributes": {"genres": [3, ""]}}) == []


def test_only_vocabulary_categories_are_used_in_vocabulary_order() -> None:
    cold = cold_start_from(CONFIG, parts(), 3, 2)
    assert cold is not None
    assert cold.used(["Drama", "Sci-Fi", "Action", "Drama"]) == ["Action", "Drama"]
    assert cold.used(["Sci-Fi"]) == []
    vec = cold.vectors([["Action", "Drama"]])[0]
    table = parts()[CATEGORY_TABLE].numpy()
    np.testing.assert_allclose(vec[3:], (table[0] + table[2]) / 2, rtol=1e-6)
    np.testing.assert_array_equal(vec[:3], parts()[NEW_ITEM_TABLE].numpy())
    with pytest.raises(ArtifactError, match="not in the version's vocabulary"):
        cold.vectors([["Sci-Fi"]])


def test_a_version_without_a_new_item_vector_has_no_cold_start() -> None:
    state = parts()
    del state[NEW_ITEM_TABLE]
    assert cold_start_from(CONFIG, state, 3, 2) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({NEW_ITEM_TABLE: torch.zeros(4)}, r"new_item is \[4\], expected \[3\]"),
        ({CATEGORY_TABLE: torch.zeros(3, 2)}, r"expected \[4, 2\]"),
        ({NEW_ITEM_TABLE: torch.tensor([0.0, float("nan"), 0.0])}, "NaN"),
    ],
)
def test_malformed_cold_start_parts_are_refused(change: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ArtifactError, match=message):
        cold_start_from(CONFIG, {**parts(), **change}, 3, 2)
    with pytest.raises(ArtifactError, match="vocabulary"):
        cold_start_from({"version": "v1"}, parts(), 3, 2)


def test_cold_start_is_plain_data() -> None:
    cold = ColdStart(np.zeros(2, np.float32), np.ones((1, 1), np.float32), {"a": 0})
    np.testing.assert_array_equal(cold.vectors([["a"], ["a"]]), [[0, 0, 1], [0, 0, 1]])
