"""Cold-start item vectors: items unknown to a version's item table, scored by their attributes.

A served item vector is ``[id embedding (id_dim), mean of the item's category embeddings
(category_dim)]`` (:class:`scoring.model.din.ItemTower`). An item published after the version
was trained has no row; when its attributes are known (the item attribute table), its vector
is ``[the version's learned "new item" id vector, mean of the embeddings of its categories in
the version's category vocabulary]`` instead of the OOV row. An item with no category in the
vocabulary keeps the OOV row.

The version ships both parts in its dense weights (safetensors): ``tables.new_item``
``[id_dim]`` and ``tables.category`` ``[G, category_dim]``, with the vocabulary in config.json
``feature_spec.category.vocabulary``. :func:`cold_vectors` is the one definition, used by the
scoring worker and by ``rescore`` alike; a version without ``tables.new_item`` (trained before
it existed) serves unknown items with the OOV row.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrank.errors import ArtifactError

logger = logging.getLogger(__name__)

NEW_ITEM_TABLE = "tables.new_item"  # [id_dim]: the learned id part of every cold-start item
CATEGORY_TABLE = "tables.category"  # [G, category_dim]: the category embeddings
GENRES = "genres"  # the attribute whose values count as categories besides ``category``
CATEGORY_SEP = "|"  # several categories in one string (MovieLens genres: "Action|Comedy")

FloatArray = npt.NDArray[np.float32]


def cold_vectors(
    new_item: FloatArray, categories: FloatArray, used: Sequence[Sequence[int]]
) -> FloatArray:
    """``[n, id_dim + category_dim]`` float32: row k = ``[new_item, mean of
    categories[used[k]]]``; each ``used[k]`` is non-empty (rows of ``categories``)."""
    out = np.empty((len(used), new_item.shape[0] + categories.shape[1]), dtype=np.float32)
    out[:, : new_item.shape[0]] = new_item
    for k, rows in enumerate(used):
        out[k, new_item.shape[0] :] = categories[np.asarray(rows, dtype=np.intp)].mean(
            axis=0, dtype=np.float32
        )
    return out


def attribute_categories(value: Mapping[str, Any]) -> list[str]:
    """The category names of one item attribute value (the JSON of the item attribute table):
    its ``category`` cut at ``|`` and its ``genres`` attribute (a string cut at ``|``, or a
    list), in that order, without repeats."""
    names: list[str] = []
    category = value.get("category")
    if isinstance(category, str):
        names += category.split(CATEGORY_SEP)
    attributes = value.get("attributes")
    genres = attributes.get(GENRES) if isinstance(attributes, dict) else None
    if isinstance(genres, str):
        names += genres.split(CATEGORY_SEP)
    elif isinstance(genres, list | tuple):
        names += [g for g in genres if isinstance(g, str)]
    return list(dict.fromkeys(n for n in names if n))


@dataclass(frozen=True)
class ColdStart:
    """A version's cold-start parts: the new-item id vector, the category embeddings and
    their vocabulary (name -> row)."""

    new_item: FloatArray  # [id_dim]
    categories: FloatArray  # [G, category_dim]
    vocabulary: Mapping[str, int]

    def used(self, names: Sequence[str]) -> list[str]:
        """The names of ``names`` in the vocabulary, in vocabulary order (what a cold vector
        is built from, and what the served log records)."""
        rows = sorted({self.vocabulary[n] for n in names if n in self.vocabulary})
        order = {row: name for name, row in self.vocabulary.items()}
        return [order[row] for row in rows]

    def vectors(self, used: Sequence[Sequence[str]]) -> FloatArray:
        """The cold vectors of items by their used categories (each non-empty, in the
        vocabulary: as :meth:`used` gives them)."""
        try:
            rows = [[self.vocabulary[n] for n in names] for names in used]
        except KeyError as exc:
            raise ArtifactError(f"category {exc} is not in the version's vocabulary") from None
        return cold_vectors(self.new_item, self.categories, rows)


def cold_start_from(
    config: Mapping[str, Any], state: Mapping[str, Any], id_dim: int, category_dim: int
) -> ColdStart | None:
    """The cold-start parts of a version (``state``: its dense tensors by name), checked; None
    when the version ships no new-item vector (cold start off for it, logged). Raises
    ArtifactError when the parts it ships are malformed."""
    version = config.get("version", "?")
    if NEW_ITEM_TABLE not in state:
        logger.info(
            "version %s has no %s (trained before cold start): unknown items get the OOV row",
            version,
            NEW_ITEM_TABLE,
        )
        return None
    new_item = _array(state[NEW_ITEM_TABLE])
    categories = _array(state.get(CATEGORY_TABLE))
    vocabulary = config.get("feature_spec", {}).get("category", {}).get("vocabulary")
    if not isinstance(vocabulary, list) or not all(isinstance(v, str) for v in vocabulary):
        raise ArtifactError(
            f"version {version}: ships {NEW_ITEM_TABLE} but config.json lacks "
            "feature_spec.category.vocabulary (a list of names)"
        )
    if new_item.shape != (id_dim,):
        raise ArtifactError(
            f"version {version}: {NEW_ITEM_TABLE} is {list(new_item.shape)}, expected [{id_dim}]"
        )
    if categories.shape != (len(vocabulary), category_dim):
        raise ArtifactError(
            f"version {version}: {CATEGORY_TABLE} is {list(categories.shape)}, expected "
            f"[{len(vocabulary)}, {category_dim}] (the vocabulary's size, category_dim)"
        )
    if not (np.isfinite(new_item).all() and np.isfinite(categories).all()):
        raise ArtifactError(f"version {version}: the cold-start tables hold NaN/Inf")
    return ColdStart(new_item, categories, {name: k for k, name in enumerate(vocabulary)})


def _array(tensor: Any) -> FloatArray:
    """A tensor (or None) as a float32 numpy array (empty for None)."""
    if tensor is None:
        return np.zeros((0,), dtype=np.float32)
    values = tensor.detach().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
    return np.ascontiguousarray(values, dtype=np.float32)
