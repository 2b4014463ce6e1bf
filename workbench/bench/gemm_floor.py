"""The forward's matrix products alone: a floor for every runtime that calls the same kernels.

One eager forward runs under a :class:`TorchDispatchMode` that records each matrix product
(``mm``, ``addmm``, ``bmm``, ``baddbmm``) with copies of its operands; replaying only those
calls times what is left of the forward once every elementwise op, copy and dispatch is free.
No runtime that computes the same products with the same kernels (inductor calls them as
extern kernels) can be faster than ``eager / floor``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_PRODUCTS = {_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm}


class ProductCall(NamedTuple):
    """One recorded matrix product: the op, its operands (copies) and its floating-point ops."""

    op: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    flops: int


def product_flops(op: Any, args: tuple[Any, ...]) -> int:
    """``2·m·k·n`` (times the batch for ``bmm``) of one product's operands."""
    a, b = (args[1], args[2]) if op.overloadpacket in (_aten.addmm, _aten.baddbmm) else args[:2]
    batch = a.shape[0] if a.dim() == 3 else 1
    return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[ProductCall] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        out = func(*args, **kwargs)
        if func.overloadpacket in _PRODUCTS:
            copies = tuple(a.clone() if isinstance(a, Tensor) else a for a in args)
            self.calls.append(ProductCall(func, copies, kwargs, product_flops(func, copies)))
        return out


def record_products(forward: Callable[[], Tensor]) -> list[ProductCall]:
    """The matrix products one call of ``forward`` makes, in order (under ``no_grad``: in
    inference mode the mode would see ``matmul`` and ``linear`` before they decompose)."""
    with torch.no_grad(), _Recorder() as recorder:
        forward()
    return recorder.calls


def replay(calls: list[ProductCall]) -> Callable[[], None]:
    """A function that runs only ``calls`` (the floor's timed body)."""

    def products_only() -> None:
        for call in calls:
            call.op(*call.args, **call.kwargs)

    return products_only
