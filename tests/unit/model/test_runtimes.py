"""The forward's inference runtimes: compiled and onnx score as eager does, on every shape, with
no compile while serving; a graph that is not the version's is refused; a runtime that cannot
run here falls back to eager."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from scoring.model.din import DIN, ModelSpec
from scoring.model.onnx_graph import export_graph
from scoring.model.runtimes import PROBE_TOLERANCE
from scoring.model.scorer import DinScorer
from scoring.model.side import SideArrays
from streamrank.errors import ArtifactError
from streamrank.runtime.memory import retain_freed_memory

PLAIN = ModelSpec()
SIDE = ModelSpec(categorical_sizes=(3, 5), dense_features=2, action_vocab=4)
# (requests, candidates, history): single and batched, lengths 0 and 1 (padded), large lists.
SHAPES = [(1, 1, 1), (1, 100, 50), (3, 7, 2), (2, 1, 0), (4, 500, 50), (1, 2, 30), (2, 50, 50)]


def _net(spec: ModelSpec, seed: int) -> DIN:
    torch.manual_seed(seed)
    net = DIN(spec).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # away from init, so every weight matters
    return net


def _inputs(spec: ModelSpec, b: int, c: int, length: int, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    d = spec.item_dim
    hist = rng.standard_normal((b, length, d)).astype(np.float32)
    hist_mask = rng.random((b, length)) > 0.2
    cands = rng.standard_normal((b, c, d)).astype(np.float32)
    cand_mask = rng.random((b, c)) > 0.1
    side = None
    if spec.categorical_sizes:
        codes = np.stack([rng.integers(0, n, b) for n in spec.categorical_sizes], axis=1)
        dense = rng.random((b, c, spec.dense_features)).astype(np.float32)
        side = SideArrays(codes, dense, rng.integers(0, spec.action_vocab, (b, length)))
    return hist, hist_mask, cands, cand_mask, side


@pytest.mark.parametrize("spec", [PLAIN, SIDE], ids=["plain", "side_inputs"])
def test_compiled_and_onnx_score_as_eager_on_every_shape(spec: ModelSpec) -> None:
    net = _net(spec, 0)
    eager = DinScorer(net)
    compiled = DinScorer(net, runtime="compiled")
    onnx = DinScorer(net, runtime="onnx", graph=export_graph(eager.pair))
    assert (compiled.runtime, onnx.runtime, compiled.fallback) == ("compiled", "onnx", None)
    graphs = counters["stats"]["unique_graphs"]
    for i, shape in enumerate(SHAPES):
        args = _inputs(spec, *shape, seed=i)
        want = eager.score(*args)
        for scorer in (compiled, onnx):
            got = scorer.score(*args)
            assert got.shape == want.shape
            assert np.abs(got - want).max() <= PROBE_TOLERANCE, (scorer.runtime, shape)
            assert not got[~args[3]].any()  # padded candidates score 0
    # warm-up compiled every graph: serving these shapes compiled nothing more
    assert counters["stats"]["unique_graphs"] == graphs


def test_versions_of_one_architecture_share_the_compiled_graphs() -> None:
    first = DinScorer(_net(PLAIN, 1), runtime="compiled")
    graphs = counters["stats"]["unique_graphs"]
    second = DinScorer(_net(PLAIN, 2), runtime="compiled")
    assert counters["stats"]["unique_graphs"] == graphs  # no compile for the second version
    args = _inputs(PLAIN, 2, 20, 10, seed=3)
    for scorer in (first, second):
        want = DinScorer(scorer.net).score(*args)
        assert np.abs(scorer.score(*args) - want).max() <= PROBE_TOLERANCE  # its own weights


def test_an_onnx_graph_of_other_weights_is_refused() -> None:
    other = export_graph(DinScorer(_net(PLAIN, 5)).pair)
    with pytest.raises(ArtifactError, match="does not hold this version's weights"):
        DinScorer(_net(PLAIN, 6), runtime="onnx", graph=other)


def test_an_onnx_graph_of_another_architecture_is_refused() -> None:
    plain = export_graph(DinScorer(_net(PLAIN, 5)).pair)
    with pytest.raises(ArtifactError, match="its config needs"):
        DinScorer(_net(SIDE, 5), runtime="onnx", graph=plain)
    with pytest.raises(ArtifactError, match="does not load"):
        DinScorer(_net(PLAIN, 5), runtime="onnx", graph=b"not a graph")


def test_onnx_without_a_published_graph_serves_eager_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        scorer = DinScorer(_net(PLAIN, 7), runtime="onnx", graph=None)
    assert scorer.runtime == "eager"
    assert scorer.fallback is not None and "no ONNX graph" in scorer.fallback
    assert "serving eager" in caplog.text


def test_compiled_without_a_compiler_serves_eager_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch._inductor.config as inductor

    torch._dynamo.reset()  # nothing compiled or cached may stand in for the compiler
    monkeypatch.setattr(inductor.cpp, "cxx", ("/nonexistent/g++",))
    monkeypatch.setattr(inductor, "fx_graph_cache", False)
    with caplog.at_level(logging.ERROR):
        scorer = DinScorer(_net(PLAIN, 8), runtime="compiled")
    torch._dynamo.reset()
    assert scorer.runtime == "eager"
    assert scorer.fallback is not None and "STREAMRANK_SCORING_RUNTIME=eager" in scorer.fallback
    args = _inputs(PLAIN, 1, 5, 4, seed=1)
    assert np.array_equal(scorer.score(*args), DinScorer(scorer.net).score(*args))


def test_int8_dense_weights_report_their_own_runtime() -> None:
    assert DinScorer(_net(PLAIN, 9), dense="int8", runtime="compiled").runtime == "int8"


def test_the_allocator_keeps_freed_memory_on_glibc() -> None:
    assert retain_freed_memory(0) is False  # 0: glibc's defaults, nothing changed
    assert retain_freed_memory(256) is True  # this host's C library is glibc


def test_a_request_sliced_from_a_padded_batch_compiles_nothing_more() -> None:
    # The per-request forward passes each request's rows as views of the batch's padded arrays
    # (strided, not contiguous): they must run on the warmed-up graphs, not compile new ones.
    net = _net(PLAIN, 4)
    compiled = DinScorer(net, runtime="compiled")
    hist, hist_mask, cands, cand_mask, _ = _inputs(PLAIN, 4, 60, 50, seed=5)
    graphs = counters["stats"]["unique_graphs"]
    for b, (h, c) in enumerate([(50, 60), (17, 60), (3, 41), (50, 9)]):
        one = (hist[b : b + 1, :h], hist_mask[b : b + 1, :h], cands[b : b + 1, :c],
               cand_mask[b : b + 1, :c])  # fmt: skip
        want = DinScorer(net).score(*one)
        assert np.abs(compiled.score(*one) - want).max() <= PROBE_TOLERANCE, (h, c)
    assert counters["stats"]["unique_graphs"] == graphs
