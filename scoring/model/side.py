"""The inputs a model takes beside the history and the candidates, as tensors and as arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class SideInputs:
    """Inputs beside the history and the candidates (``None``: the spec has none of them).

    ``codes [B, P]`` long: per-request categorical codes (context, user attributes);
    ``dense [B, C, F]`` (or ``[B, F]`` with one candidate per row) float: counters per
    candidate; ``actions [B, L]`` long: each history event's action code, aligned with ``hist``.
    """

    codes: Tensor | None = None
    dense: Tensor | None = None
    actions: Tensor | None = None

    def rows(self, start: int, stop: int) -> SideInputs:
        """The side inputs of requests ``start:stop``."""
        return SideInputs(*(None if t is None else t[start:stop] for t in self.astuple()))

    def astuple(self) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        return self.codes, self.dense, self.actions


NO_SIDE = SideInputs()


def require(tensor: Tensor | None, what: str) -> Tensor:
    if tensor is None:
        raise ValueError(f"this model needs {what} (its feature spec has them)")
    return tensor


@dataclass(frozen=True, slots=True)
class SideArrays:
    """:class:`SideInputs` as numpy arrays (what serving and offline scoring build)."""

    codes: npt.NDArray[np.int64] | None = None  # [B, P]
    dense: npt.NDArray[np.float32] | None = None  # [B, C, F]
    actions: npt.NDArray[np.int64] | None = None  # [B, L]


def tensor(value: npt.ArrayLike | Tensor, dtype: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value.bool() if dtype is bool else value.float()
    return torch.as_tensor(np.asarray(value, dtype=dtype))


def side_tensors(side: SideArrays | None) -> SideInputs:
    if side is None:
        return NO_SIDE
    return SideInputs(
        None if side.codes is None else torch.as_tensor(np.asarray(side.codes)).long(),
        None if side.dense is None else tensor(side.dense, np.float32),
        None if side.actions is None else torch.as_tensor(np.asarray(side.actions)).long(),
    )
