"""The serving scorer of a trained DIN (:class:`DinScorer`): probabilities for many candidates
against one history per request, on the inference runtime chosen for the worker.

* The fp32 forward is :class:`scoring.model.pair_forward.PairForward`, run by a runtime of
  :mod:`scoring.model.runtimes`: ``eager`` (the default here: offline scoring), ``compiled``
  or ``onnx`` (what a worker serves, ``STREAMRANK_SCORING_RUNTIME``). A runtime that cannot run
  here (no C++ compiler, no onnxruntime, no graph published) falls back to eager with an error
  logged; one that disagrees with eager on the probe refuses the version (ArtifactError).
* ``dense="int8"``: the attention unit with int8 weights (torch's dynamic quantisation); the
  product term and the head stay fp32 (docs/benchmarks-model.md). A dynamic range spans its whole
  input, so the int8 forward runs one request at a time on its *valid* events and candidates
  only: the served scores equal an offline scoring with the same option (tested).

Masks are required arguments everywhere; padded positions never change a score (tested).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from safetensors.torch import load as st_load
from torch import Tensor, nn
from torch.ao.quantization import quantize_dynamic

from scoring.model.coldstart import ColdStart, cold_start_from
from scoring.model.din import (
    DENSE_WEIGHTS,
    DIN,
    TABLE_PREFIX,
    DenseWeights,
    ModelSpec,
    features_of,
)  # fmt: skip
from scoring.model.features import FeatureSpec
from scoring.model.pair_forward import PairForward
from scoring.model.runtimes import (
    FORWARD_RUNTIMES,
    CompiledForward,
    EagerForward,
    Forward,
    ForwardRuntime,
)  # fmt: skip
from scoring.model.side import NO_SIDE, SideArrays, SideInputs, side_tensors, tensor
from streamrank.errors import ArtifactError, RuntimeUnavailable

logger = logging.getLogger(__name__)


def _linear(weight: Tensor, bias: Tensor | None) -> nn.Linear:
    """An ``nn.Linear`` holding ``weight [out, in]`` (and ``bias [out]``)."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


def _quantised(pair: PairForward) -> nn.ModuleDict:
    """The attention unit's Linear layers as int8 (a quantised copy: ``pair`` stays fp32)."""
    fp32 = nn.ModuleDict(
        {
            "cand": _linear(pair.w_cand.t(), pair.bias),  # d -> h
            "hist": _linear(pair.w_hist.t(), None),  # d -> h
            "rest": pair.rest,
        }
    )
    with warnings.catch_warnings():
        # torch 2.13 warns that its quantised tensor types will move to torchao; they still
        # work, and the int8 option is opt-in, so the warning would repeat on every load.
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions")
        return quantize_dynamic(fp32, {nn.Linear}, dtype=torch.qint8).eval()


def runtime_forward(
    pair: PairForward, runtime: ForwardRuntime, *, graph: bytes | None = None, threads: int = 1
) -> Forward:
    """``pair`` on ``runtime``, compiled or loaded and checked against eager. Raises
    RuntimeUnavailable (cannot run here) or ArtifactError (``graph`` is not this version's)."""
    if runtime == "eager":
        return EagerForward(pair)
    if runtime == "compiled":
        compiled = CompiledForward(pair)
        seconds = compiled.warm_up()
        logger.info("compiled the forward in %.1f s", seconds)
        return compiled
    if graph is None:
        raise RuntimeUnavailable(
            "the version has no ONNX graph (published without streamrank[onnx]); publish a "
            "version with it installed, or set STREAMRANK_SCORING_RUNTIME=compiled"
        )
    from scoring.model.onnx_graph import OnnxForward

    onnx = OnnxForward(graph, threads=threads)
    onnx.check(pair)
    return onnx


class DinScorer:
    """Serving forward of a trained DIN: many candidates against one history per request.

    ``dense``: ``"fp32"`` (the trained weights) or ``"int8"`` (quantised: the module doc);
    ``runtime``: what runs the fp32 forward (``graph``: the version's ONNX graph, for onnx)."""

    cold_start: ColdStart | None = None  # the version's cold-start parts (scoring.model.coldstart)

    def __init__(
        self,
        net: DIN,
        *,
        dense: DenseWeights = "fp32",
        features: FeatureSpec | None = None,
        runtime: ForwardRuntime = "eager",
        graph: bytes | None = None,
        threads: int = 1,
    ) -> None:
        if dense not in DENSE_WEIGHTS:
            raise ValueError(f"dense weights {dense!r}: use one of {', '.join(DENSE_WEIGHTS)}")
        if runtime not in FORWARD_RUNTIMES:
            raise ValueError(f"runtime {runtime!r}: use one of {', '.join(FORWARD_RUNTIMES)}")
        self.net = net.eval()
        self.spec = net.spec
        self.dense: DenseWeights = dense
        self.features = features or FeatureSpec()  # the inputs the version's requests need
        self.pair = PairForward(self.net)
        self._int8 = _quantised(self.pair) if dense == "int8" else None
        self.fallback: str | None = None  # why the configured runtime is not the one serving
        if self._int8 is not None:
            runtime = "eager"  # int8 weights run a forward of their own: nothing to compile
        try:
            self.forward: Forward = runtime_forward(
                self.pair, runtime, graph=graph, threads=threads
            )
        except RuntimeUnavailable as exc:
            logger.error("the %s runtime cannot serve here; serving eager: %s", runtime, exc)
            self.fallback = str(exc)
            self.forward = EagerForward(self.pair)

    @property
    def runtime(self) -> str:
        """The runtime serving this scorer's forward (``int8`` for int8 dense weights)."""
        return "int8" if self._int8 is not None else self.forward.runtime

    @classmethod
    def from_state(
        cls,
        spec: ModelSpec,
        state: Mapping[str, Tensor],
        *,
        features: FeatureSpec | None = None,
        **options: Any,
    ) -> DinScorer:
        """Build from a dense state dict (small tables under ``tables.`` are ignored here);
        ``options``: the constructor's (dense, runtime, graph, threads)."""
        if spec.kind != "din":
            raise ArtifactError(f"the serving scorer needs a DIN artifact, not {spec.kind!r}")
        net = DIN(spec)
        weights = {k: v for k, v in state.items() if not k.startswith(TABLE_PREFIX)}
        broken = sorted(k for k, v in weights.items() if not bool(torch.isfinite(v).all()))
        if broken:
            # Every score would be NaN: refuse the version rather than serve it.
            raise ArtifactError(f"dense weights hold NaN/Inf in {', '.join(broken[:5])}")
        try:
            net.load_state_dict(weights, strict=True)
        except RuntimeError as exc:
            raise ArtifactError(
                f"dense weights do not match the config's model dims: {exc}"
            ) from exc
        return cls(net, features=features, **options)

    @classmethod
    def from_bytes(
        cls,
        config: Mapping[str, Any],
        dense: bytes,
        *,
        weights: DenseWeights = "fp32",
        runtime: ForwardRuntime = "eager",
        graph: bytes | None = None,
        threads: int = 1,
    ) -> DinScorer:
        """Build from config.json (parsed) and the dense safetensors bytes (as stored in Redis);
        ``weights``: serve them as fp32 or int8; ``runtime``, ``graph``: the constructor's."""
        spec = ModelSpec.from_json(config.get("model", {}))
        try:
            state = st_load(dense)
        except Exception as exc:  # safetensors raises its own error types
            raise ArtifactError(f"dense weights are not a valid safetensors file: {exc}") from exc
        scorer = cls.from_state(
            spec, state, features=features_of(config, spec), dense=weights, runtime=runtime,
            graph=graph, threads=threads,
        )  # fmt: skip
        scorer.cold_start = cold_start_from(config, state, spec.id_dim, spec.category_dim)
        return scorer

    # (candidate, event) pairs per chunk: keeps the [b, C, L, h] intermediates in cache
    # (docs/model.md#the-serving-forward-dinscorer).
    PAIRS_PER_CHUNK = 10_000

    @torch.inference_mode()
    def score_logits(
        self,
        hist: Tensor,
        hist_mask: Tensor,
        cands: Tensor,
        cand_mask: Tensor,
        side: SideInputs = NO_SIDE,
    ) -> Tensor:
        """``hist [B, L, d]``, ``hist_mask [B, L]``, ``cands [B, C, d]``, ``cand_mask [B, C]`` ->
        logits ``[B, C]`` (padded candidates: 0 with int8 weights, unspecified with fp32)."""
        hist = self.net.actions(hist, side)  # [B, L, d]
        if self._int8 is not None:
            return self._logits_int8(self._int8, hist, hist_mask, cands, cand_mask, side)
        b, c, length = cands.shape[0], cands.shape[1], hist.shape[1]
        step = max(1, self.PAIRS_PER_CHUNK // max(1, c * length))
        if step >= b:
            return self.forward(hist, hist_mask, cands, side.codes, side.dense)
        parts = []
        for i in range(0, b, step):
            rows = side.rows(i, i + step)
            parts.append(
                self.forward(
                    hist[i : i + step],
                    hist_mask[i : i + step],
                    cands[i : i + step],
                    rows.codes,
                    rows.dense,
                )
            )
        return torch.cat(parts)  # [B, C]

    def _logits_int8(
        self,
        q: nn.ModuleDict,
        hist: Tensor,
        hist_mask: Tensor,
        cands: Tensor,
        cand_mask: Tensor,
        side: SideInputs,
    ) -> Tensor:
        """The int8 forward, one request at a time on its valid events and candidates (a
        dynamic range must not see padding or other requests)."""
        out = torch.zeros(cand_mask.shape)  # [B, C]
        for i in range(cands.shape[0]):
            keep = cand_mask[i].nonzero().squeeze(1)  # [c]
            if keep.numel() == 0:
                continue
            cv = cands[i, keep].unsqueeze(0)  # [1, c, d]
            hv = hist[i, hist_mask[i]]  # [l, d]: the valid events only
            if hv.shape[0]:
                a = q["cand"](cv).unsqueeze(2)  # [1, c, 1, h]
                h = q["hist"](hv)  # [l, h]
                qw = cv.unsqueeze(-1) * self.pair.w_prod  # [1, c, d, h]: product term stays fp32
                x = torch.matmul(hv, qw)  # [1, c, l, h]
                x += a
                x += h
                w = q["rest"](x).squeeze(-1)  # [1, c, l]
                pooled = torch.matmul(w, hv)  # [1, c, d]
            else:
                pooled = torch.zeros_like(cv)  # [1, c, d]: no history, no interest
            one = side.rows(i, i + 1)
            if one.dense is not None:
                one = SideInputs(one.codes, one.dense[:, keep], one.actions)  # [1, c, F]
            out[i, keep] = self.net.head(pooled, cv, one)[0]  # [c]: the head stays fp32
        return out

    def score(
        self,
        hist: npt.ArrayLike | Tensor,
        hist_mask: npt.ArrayLike | Tensor,
        cands: npt.ArrayLike | Tensor,
        cand_mask: npt.ArrayLike | Tensor,
        side: SideArrays | None = None,
    ) -> npt.NDArray[np.float32]:
        """Click probabilities ``[B, C]`` (0 where ``cand_mask`` is False).

        ``hist [B, L, d]`` float32, ``hist_mask [B, L]`` bool, ``cands [B, C, d]`` float32,
        ``cand_mask [B, C]`` bool. A request with an empty history is scored on the candidate alone.
        ``side``: the inputs the version's feature spec adds (:class:`SideArrays`); a model
        without side inputs takes none.
        """
        h, hm = tensor(hist, np.float32), tensor(hist_mask, bool)
        c, cm = tensor(cands, np.float32), tensor(cand_mask, bool)
        d = self.spec.item_dim
        if h.dim() != 3 or c.dim() != 3 or h.shape[-1] != d or c.shape[-1] != d:
            raise ValueError(
                f"expected hist [B, L, {d}] and cands [B, C, {d}], got {tuple(h.shape)}, {tuple(c.shape)}"
            )
        if hm.shape != h.shape[:2] or cm.shape != c.shape[:2] or h.shape[0] != c.shape[0]:
            raise ValueError("masks must be [B, L] and [B, C] matching hist and cands")
        probs = torch.sigmoid(self.score_logits(h, hm, c, cm, side_tensors(side)))  # [B, C]
        return torch.where(cm, probs, torch.zeros_like(probs)).numpy()
