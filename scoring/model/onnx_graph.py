"""The serving forward as an ONNX graph, exported at publish, and its ONNX Runtime session.

The graph is data (protobuf, no pickle); a worker checks it against the version's own weights
on a probe before serving it (:func:`scoring.model.runtimes.check_probe`), so a graph of another
version or architecture is refused. Needs ``streamrank[onnx]`` (the exporter's ``onnx`` and
``onnxruntime``).
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from scoring.model.pair_forward import PairForward
from scoring.model.runtimes import ForwardRuntime, check_probe, probe_inputs
from streamrank.errors import ArtifactError, RuntimeUnavailable

INPUTS = ("hist", "hist_mask", "cands", "codes", "dense")
AXES = {"hist": {0: "B", 1: "L"}, "hist_mask": {0: "B", 1: "L"}, "cands": {0: "B", 1: "C"},
        "codes": {0: "B"}, "dense": {0: "B", 1: "C"}, "logits": {0: "B", 1: "C"}}  # fmt: skip
OPSET = 17
INSTALL = "pip install 'streamrank[onnx]'"


class _Positional(nn.Module):
    """The forward with only the inputs this architecture takes, in :data:`INPUTS` order."""

    def __init__(self, pair: PairForward, names: list[str]) -> None:
        super().__init__()
        self.pair, self.names = pair, names

    def forward(self, *tensors: Tensor) -> Tensor:
        out: Tensor = self.pair(**dict(zip(self.names, tensors, strict=True)))
        return out


def input_names(pair: PairForward) -> list[str]:
    """The graph inputs of ``pair``'s architecture (side inputs only where it takes them)."""
    probe = probe_inputs(pair, 2)._asdict()
    return [n for n in INPUTS if probe[n] is not None]


def export_graph(pair: PairForward) -> bytes:
    """The ONNX graph of ``pair`` (batch, candidate and history lengths dynamic)."""
    try:
        import onnx  # noqa: F401  (torch's exporter serialises with it)
    except ImportError as exc:
        raise RuntimeUnavailable(
            f"exporting an ONNX graph needs the onnx package: {INSTALL}"
        ) from exc
    names = input_names(pair)
    probe = probe_inputs(pair, 2)._asdict()
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        # The TorchScript-based exporter (dynamo=False) takes this graph without onnxscript.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            _Positional(pair, names), tuple(probe[n] for n in names), buf,  # type: ignore[arg-type]
            input_names=names, output_names=["logits"], opset_version=OPSET,
            dynamic_axes={n: AXES[n] for n in [*names, "logits"]}, dynamo=False,
        )  # fmt: skip
    return buf.getvalue()


class OnnxForward:
    """ONNX Runtime on a version's exported graph, ``threads`` intra-op threads."""

    runtime: ForwardRuntime = "onnx"

    def __init__(self, graph: bytes, *, threads: int = 1) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise RuntimeUnavailable(f"the onnx runtime needs onnxruntime: {INSTALL}") from exc
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self._session: Any = ort.InferenceSession(
                graph, options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own error types on a bad graph
            raise ArtifactError(f"the version's ONNX graph does not load: {exc!r:.300}") from exc
        self.names = [i.name for i in self._session.get_inputs()]

    def __call__(
        self, hist: Tensor, hist_mask: Tensor, cands: Tensor, codes: Tensor | None,
        dense: Tensor | None,
    ) -> Tensor:  # fmt: skip
        given = {"hist": hist, "hist_mask": hist_mask, "cands": cands, "codes": codes,
                 "dense": dense}  # fmt: skip
        feeds = {n: np.ascontiguousarray(given[n].numpy()) for n in self.names}  # type: ignore[union-attr]
        return torch.from_numpy(self._session.run(None, feeds)[0])

    def check(self, pair: PairForward) -> None:
        """Refuse (ArtifactError) a graph whose inputs or outputs are not this version's."""
        expected = input_names(pair)
        if self.names != expected:
            raise ArtifactError(
                f"the version's ONNX graph takes {self.names}, its config needs {expected}: "
                "publish the version again"
            )
        for batch in (1, 2):
            probe = probe_inputs(pair, batch)
            with torch.inference_mode():
                check_probe(pair, probe, self(*probe), self.runtime)
