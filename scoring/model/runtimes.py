"""Inference runtimes of the serving forward (:class:`PairForward`), same weights, same inputs.

* ``compiled`` (the default): inductor (``torch.compile``) generates fused C++ kernels for the
  forward; it needs a C++ compiler at run time. One graph per model architecture with dynamic
  candidate and history lengths (and one for a single request, one for a batch), compiled and
  checked against eager by :meth:`CompiledForward.warm_up` before a version takes traffic;
  inductor caches what it built under ``TORCHINDUCTOR_CACHE_DIR``.
* ``eager``: the module as it is, op by op.
* ``onnx``: ONNX Runtime on the graph exported at publish (``streamrank[onnx]``).

Lengths below 2 are padded to 2 (masked) so that no size-1 specialisation of a dynamic length
compiles while serving.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, ParamSpec, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from scoring.model.pair_forward import PairForward
from streamrank.errors import ArtifactError, RuntimeUnavailable

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
ForwardRuntime = Literal["compiled", "eager", "onnx"]
FORWARD_RUNTIMES: tuple[ForwardRuntime, ...] = ("compiled", "eager", "onnx")
PROBE_TOLERANCE = 1e-5  # most a runtime's probabilities may differ from eager's on the probe
MIN_LENGTH = 2  # candidate and history lengths below this are padded


class Probe(NamedTuple):
    """Deterministic inputs that a runtime's forward must score as eager does."""

    hist: Tensor  # [B, L, d]
    hist_mask: Tensor  # [B, L]
    cands: Tensor  # [B, C, d]
    codes: Tensor | None  # [B, P]
    dense: Tensor | None  # [B, C, F]


class Forward(Protocol):
    """A runtime's forward: logits ``[B, C]`` (see :meth:`PairForward.forward`)."""

    runtime: ForwardRuntime

    def __call__(
        self, hist: Tensor, hist_mask: Tensor, cands: Tensor, codes: Tensor | None,
        dense: Tensor | None,
    ) -> Tensor: ...  # fmt: skip


class EagerForward:
    runtime: ForwardRuntime = "eager"

    def __init__(self, pair: PairForward) -> None:
        self.pair = pair

    def __call__(
        self, hist: Tensor, hist_mask: Tensor, cands: Tensor, codes: Tensor | None,
        dense: Tensor | None,
    ) -> Tensor:  # fmt: skip
        return self.pair(hist, hist_mask, cands, codes, dense)


def _pad_lengths(
    hist: Tensor, hist_mask: Tensor, cands: Tensor, dense: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Candidates and history padded (zeros, masked) to at least :data:`MIN_LENGTH`."""
    pad_l = max(0, MIN_LENGTH - hist.shape[1])
    pad_c = max(0, MIN_LENGTH - cands.shape[1])
    if pad_l:
        hist = F.pad(hist, (0, 0, 0, pad_l))  # [B, 2, d]
        hist_mask = F.pad(hist_mask, (0, pad_l), value=False)  # [B, 2]
    if pad_c:
        cands = F.pad(cands, (0, 0, 0, pad_c))  # [B, 2, d]
        if dense is not None:
            dense = F.pad(dense, (0, 0, 0, pad_c))  # [B, 2, F]
    return hist, hist_mask, cands, dense


def untraced(hook: Callable[P, R]) -> Callable[P, R]:
    """``hook`` kept out of torch.compile's frame tracing: a ``gc.callbacks`` hook may run in the
    middle of a compiled forward, where Dynamo would otherwise try to compile it."""
    return torch.compiler.disable(hook, recursive=True)


class CompiledForward:
    """The forward compiled by inductor; :meth:`warm_up` before it serves."""

    runtime: ForwardRuntime = "compiled"

    def __init__(self, pair: PairForward) -> None:
        self.pair = pair
        # Two graphs per architecture (one request, a batch); a process may load many.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        # Not fullgraph=True: with it, a gc.callbacks hook that runs during a call (the worker's
        # GC-pause metric) fails the call; warm_up raises on any graph break instead.
        self._compiled: Any = torch.compile(pair, fullgraph=False)

    def __call__(
        self, hist: Tensor, hist_mask: Tensor, cands: Tensor, codes: Tensor | None,
        dense: Tensor | None,
    ) -> Tensor:  # fmt: skip
        width = cands.shape[1]
        hist, hist_mask, cands, dense = _pad_lengths(hist, hist_mask, cands, dense)
        out: Tensor = self._compiled(
            _inference(hist), _inference(hist_mask), _inference(cands),
            None if codes is None else _inference(codes),
            None if dense is None else _inference(dense),
        )  # fmt: skip
        return out[:, :width]

    def warm_up(self) -> float:
        """Compile the single-request and the batch graph (lengths dynamic) and check both
        against eager; returns the seconds it took. Raises RuntimeUnavailable."""
        start = time.perf_counter()
        for batch in (1, 2):
            with torch.inference_mode():
                probe = probe_inputs(self.pair, batch)
            for name, tensor in probe._asdict().items():
                lengths = () if name == "codes" else (1,)  # codes [B, P] have no length
                for dim in (0, *lengths) if batch > 1 else lengths:
                    if tensor is not None:
                        torch._dynamo.mark_dynamic(tensor, dim)
            try:
                with torch.inference_mode(), torch._dynamo.error_on_graph_break(True):
                    got = self(*probe)
            except Exception as exc:  # inductor raises many types (compiler missing, codegen)
                raise RuntimeUnavailable(
                    f"torch.compile could not compile the forward: {exc!r:.300}; install a C++ "
                    "compiler (g++) or set STREAMRANK_SCORING_RUNTIME=eager"
                ) from exc
            check_probe(self.pair, probe, got, self.runtime)
        return time.perf_counter() - start


def _inference(tensor: Tensor) -> Tensor:
    """``tensor`` as a contiguous inference tensor: the graphs are traced on them, and a normal
    tensor, or a view with other strides (a request's rows of a padded batch), would compile
    graphs of its own while serving."""
    if tensor.is_inference() and _dense_strides(tensor):
        return tensor
    with torch.inference_mode():
        return tensor.clone(memory_format=torch.contiguous_format)


def _dense_strides(tensor: Tensor) -> bool:
    """Strides of a contiguous tensor of its shape, size-1 dimensions included (the graphs'
    guards compare every stride; ``is_contiguous`` ignores those of size-1 dimensions)."""
    expected, step = [], 1
    for size in reversed(tensor.shape):
        expected.append(step)
        step *= size
    return tensor.stride() == tuple(reversed(expected))


def probe_inputs(pair: PairForward, batch: int) -> Probe:
    """Deterministic inputs of distinct lengths (3 candidates, 5 events; one event masked)."""
    gen = torch.Generator().manual_seed(7)
    d, head = pair.w_cand.shape[0], pair.head
    hist_mask = torch.ones(batch, 5, dtype=torch.bool)  # [B, L]
    hist_mask[:, -1] = False
    codes = dense = None
    if head.categorical is not None:
        codes = torch.zeros(batch, len(head.offsets), dtype=torch.long)  # [B, P]
    if head.dense_features:
        dense = torch.rand(batch, 3, head.dense_features, generator=gen)  # [B, C, F]
    hist = torch.randn(batch, 5, d, generator=gen)  # [B, L, d]
    cands = torch.randn(batch, 3, d, generator=gen)  # [B, C, d]
    return Probe(hist, hist_mask, cands, codes, dense)


def check_probe(pair: PairForward, probe: Probe, got: Tensor, runtime: str) -> None:
    """Refuse a runtime whose probabilities on ``probe`` are not eager's (ArtifactError)."""
    with torch.inference_mode():
        want = pair(*probe)
    if got.shape != want.shape:
        raise ArtifactError(
            f"the {runtime} forward returned {tuple(got.shape)}, eager {tuple(want.shape)}: "
            "its graph does not match this version's config; publish the version again"
        )
    diff = float((torch.sigmoid(got) - torch.sigmoid(want)).abs().max())
    if not np.isfinite(diff) or diff > PROBE_TOLERANCE:
        raise ArtifactError(
            f"the {runtime} forward differs from eager by {diff:.3g} (at most "
            f"{PROBE_TOLERANCE:g}): its graph does not hold this version's weights; publish the "
            "version again or set STREAMRANK_SCORING_RUNTIME=eager"
        )
