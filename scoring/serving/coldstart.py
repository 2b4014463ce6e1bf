"""Cold start in serving: the ids of a lookup that the version's item table does not know get a
cold-start vector from their attributes (:mod:`scoring.model.coldstart`) instead of the OOV row.

``cold_lookup`` is the online path: the lookup with its found mask, then, only when some ids
were not found, one pipelined read of their attributes; ``apply_cold`` puts the cold vectors
of a ``{item_id: [categories used]}`` map into the looked-up rows, online and in ``rescore``
(which takes the map from the served-log record: the categories used then, not today's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from scoring.model.coldstart import ColdStart, attribute_categories
from scoring.serving.protocols import EmbeddingSource, FoundLookup, ItemAttributeSource, Scorer
from streamrank import keys

ColdMap = dict[str, list[str]]  # item id -> the categories its cold vector was built from


def cold_start_of(scorer: Scorer) -> ColdStart | None:
    """The version's cold-start parts (None: the scorer has none, e.g. an older version)."""
    cold = getattr(scorer, "cold_start", None)
    return cold if isinstance(cold, ColdStart) else None


def apply_cold(
    rows: np.ndarray, ids: Sequence[str], used: Mapping[str, Sequence[str]], cold: ColdStart
) -> np.ndarray:
    """``rows`` (aligned with ``ids``) with the rows of the ids in ``used`` replaced by their
    cold vectors (a copy when anything is replaced)."""
    positions = [k for k, item in enumerate(ids) if item in used]
    if not positions:
        return rows
    out = np.array(rows, dtype=np.float32, copy=True)
    out[positions] = cold.vectors([used[ids[k]] for k in positions])
    return out


def cold_for(used: Mapping[str, list[str]], *id_lists: Sequence[str]) -> ColdMap:
    """The part of ``used`` that concerns the given ids (one request's history and items)."""
    if not used:
        return {}
    return {i: used[i] for ids in id_lists for i in ids if i in used}


async def cold_lookup(
    embeddings: EmbeddingSource,
    attributes: ItemAttributeSource | None,
    version: str,
    scorer: Scorer,
    ids: Sequence[str],
    *,
    bound: Callable[[], asyncio.Timeout],
) -> tuple[np.ndarray, ColdMap]:
    """The rows of ``ids`` (distinct) and the cold-start map of those that got a cold vector.
    Without cold-start parts, an attribute source or a found mask: the plain lookup."""
    cold = cold_start_of(scorer)
    if cold is None or attributes is None or not isinstance(embeddings, FoundLookup):
        async with bound():
            return await embeddings.lookup(version, keys.ITEM_TABLE, ids), {}
    async with bound():
        rows, found = await embeddings.lookup_found(version, keys.ITEM_TABLE, ids)
    unknown = [ids[k] for k in np.flatnonzero(~np.asarray(found, dtype=bool)).tolist()]
    if not unknown:
        return rows, {}
    async with bound():
        values = await attributes.item_attributes(unknown)
    used: ColdMap = {}
    for item in unknown:
        value = values.get(item)
        names = cold.used(attribute_categories(value)) if value is not None else []
        if names:
            used[item] = names
    return apply_cold(rows, ids, used, cold), used
