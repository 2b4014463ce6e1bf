"""DIN, BaseModel and the serving scorer: equivalence, masking, padding invariance, weights I/O."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scoring.model.din import DIN, BaseModel, ModelSpec, PReLU, dense_bytes, dense_state
from scoring.model.scorer import DinScorer
from scoring.model.side import NO_SIDE, SideArrays, SideInputs
from streamrank.errors import ArtifactError

SPEC = ModelSpec()
D = SPEC.item_dim


def _trained_like_din(seed: int = 0) -> DIN:
    """A DIN whose weights are perturbed away from init (so every path matters)."""
    torch.manual_seed(seed)
    net = DIN(SPEC).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return net


def _batch(b: int, c: int, l_len: int, seed: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    hist = torch.randn(b, l_len, D, generator=g)
    lengths = torch.randint(0, l_len + 1, (b,), generator=g)
    lengths[0] = l_len  # one full history
    if b > 1:
        lengths[1] = 0  # one empty history
    mask = torch.arange(l_len)[None, :] < lengths[:, None]  # [B, L], left-aligned
    cands = torch.randn(b, c, D, generator=g)
    return hist, mask, cands


def _straightforward(
    net: DIN, hist: torch.Tensor, mask: torch.Tensor, cands: torch.Tensor
) -> np.ndarray:
    b, c, _ = cands.shape
    with torch.no_grad():
        logits = net(
            hist.repeat_interleave(c, 0), mask.repeat_interleave(c, 0), cands.reshape(b * c, D)
        )
    return torch.sigmoid(logits).view(b, c).numpy()


@pytest.mark.parametrize("b", [1, 5])
def test_serving_scorer_equals_straightforward_forward(b: int) -> None:
    net = _trained_like_din()
    hist, mask, cands = _batch(b, 100, 50)
    expected = _straightforward(net, hist, mask, cands)
    got = DinScorer(net).score(hist, mask, cands, torch.ones(b, 100, dtype=torch.bool))
    assert got.shape == (b, 100)
    assert np.abs(got - expected).max() < 1e-5
    assert expected.std() > 0.01  # the scores actually vary, so the comparison means something


def test_extra_padding_leaves_scores_unchanged() -> None:
    net = _trained_like_din()
    scorer = DinScorer(net)
    hist, mask, cands = _batch(3, 7, 10)
    cmask = torch.ones(3, 7, dtype=torch.bool)
    base = scorer.score(hist, mask, cands, cmask)
    # 15 more padded slots holding large garbage values and a NaN
    junk = torch.randn(3, 15, D) * 1e3
    junk[0, 3, 5] = float("nan")
    padded = scorer.score(
        torch.cat([hist, junk], 1),
        torch.cat([mask, torch.zeros(3, 15, dtype=torch.bool)], 1),
        cands,
        cmask,
    )
    np.testing.assert_allclose(padded, base, atol=1e-6)
    # and the straightforward forward agrees with itself too
    straight = _straightforward(
        net,
        torch.cat([hist, junk], 1),
        torch.cat([mask, torch.zeros(3, 15, dtype=torch.bool)], 1),
        cands,
    )
    np.testing.assert_allclose(straight, _straightforward(net, hist, mask, cands), atol=1e-6)


def test_history_changes_scores_and_attention_is_unnormalised() -> None:
    net = _trained_like_din()
    hist, mask, cands = _batch(2, 4, 6)
    w = net.attention_weights(hist[:1], mask[:1], cands[:1, 0])
    assert not torch.allclose(w.sum(), torch.tensor(1.0))  # no softmax
    assert (w[~mask[:1]] == 0).all()
    scorer = DinScorer(net)
    cm = torch.ones(2, 4, dtype=torch.bool)
    a = scorer.score(hist, mask, cands, cm)
    b = scorer.score(hist * 2, mask, cands, cm)
    assert np.abs(a[0] - b[0]).max() > 1e-4  # row 0 has a history: it matters
    np.testing.assert_allclose(a[1], b[1], atol=1e-7)  # row 1 has an empty history


def test_masked_candidates_score_zero_and_do_not_affect_others() -> None:
    scorer = DinScorer(_trained_like_din())
    hist, mask, cands = _batch(2, 6, 8)
    full = scorer.score(hist, mask, cands, torch.ones(2, 6, dtype=torch.bool))
    cmask = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    part = scorer.score(hist, mask, cands, cmask)
    assert (part[0, 4:] == 0).all()
    np.testing.assert_allclose(part[0, :4], full[0, :4], atol=1e-7)
    np.testing.assert_allclose(part[1], full[1], atol=1e-7)


@pytest.mark.parametrize(("b", "c", "l_len"), [(0, 3, 5), (2, 0, 5), (2, 3, 0)])
def test_empty_batches_score_to_empty_or_history_free_results(b: int, c: int, l_len: int) -> None:
    # No request, no candidate, or no history anywhere: a result of the right shape, no error.
    net = _trained_like_din()
    scorer = DinScorer(net)
    g = torch.Generator().manual_seed(3)
    hist, cands = torch.randn(b, l_len, D, generator=g), torch.randn(b, c, D, generator=g)
    mask = torch.ones(b, l_len, dtype=torch.bool)
    got = scorer.score(hist, mask, cands, torch.ones(b, c, dtype=torch.bool))
    assert got.shape == (b, c) and got.dtype == np.float32
    if b and c:  # an empty history: scored on the candidate alone, like the forward
        np.testing.assert_allclose(got, _straightforward(net, hist, mask, cands), atol=1e-6)


def test_scorer_rejects_wrong_dims() -> None:
    scorer = DinScorer(_trained_like_din())
    with pytest.raises(ValueError, match="expected hist"):
        scorer.score(
            np.zeros((1, 3, D + 1)),
            np.ones((1, 3), bool),
            np.zeros((1, 2, D + 1)),
            np.ones((1, 2), bool),
        )


def test_base_model_is_masked_sum_pooling() -> None:
    torch.manual_seed(0)
    net = BaseModel(SPEC).eval()
    hist, mask, cands = _batch(2, 1, 5)
    with torch.no_grad():
        got = net(hist, mask, cands[:, 0])
        pooled = torch.stack([hist[i][mask[i]].sum(0) for i in range(2)])
        expected = net.head(pooled, cands[:, 0], NO_SIDE)
    torch.testing.assert_close(got, expected)


def test_prelu_is_per_feature_on_the_last_dim() -> None:
    act = PReLU(3)
    with torch.no_grad():
        act.weight.copy_(torch.tensor([0.0, 0.5, 2.0]))
    x = torch.tensor([[[-1.0, -1.0, -1.0], [1.0, 2.0, 3.0]]])  # [1, 2, 3]
    torch.testing.assert_close(act(x), torch.tensor([[[0.0, -0.5, -2.0], [1.0, 2.0, 3.0]]]))


def test_dense_weights_roundtrip_through_safetensors_bytes() -> None:
    net = _trained_like_din()
    state = dense_state(net, torch.randn(5, SPEC.category_dim))
    blob = dense_bytes(state)
    assert not blob.startswith(b"\x80")  # not a pickle
    scorer = DinScorer.from_bytes({"model": SPEC.to_json()}, blob)
    hist, mask, cands = _batch(2, 5, 7)
    cm = torch.ones(2, 5, dtype=torch.bool)
    np.testing.assert_array_equal(
        scorer.score(hist, mask, cands, cm), DinScorer(net).score(hist, mask, cands, cm)
    )


def test_bench_model_times_every_runtime_on_the_same_inputs() -> None:
    import argparse

    from streamrank.settings import Settings
    from workbench.bench.model import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--shapes", "6x4,9x5", "--runtimes", "eager,onnx", "--batch", "1", "3"]
    args = parser.parse_args([*argv, "--repeats", "1", "--seconds", "0.01", "--straightforward"])
    out = run(args, Settings())
    assert out["default_runtime"] == "compiled" and out["shapes"] == ["6x4", "9x5"]
    assert set(out["runtimes"]) == {"eager", "onnx"}
    for name, entry in out["runtimes"].items():
        assert set(entry["shapes"]) == {"1x6x4", "1x9x5", "3x6x4", "3x9x5"}
        assert entry["forward_rps"] == entry["shapes"]["1x6x4"]["forward_rps"] > 0
        for figures in entry["shapes"].values():
            assert figures["max_abs_prob_diff"] < 1e-5, name
    assert out["runtimes"]["eager"]["vs_eager"] == 1.0
    assert out["fastest_runtime"] in out["runtimes"]
    assert set(out["eager_default_allocator"]) == {"6x4", "9x5"}
    floor = out["gemm_floor"]
    assert "gemm_floor" not in out["runtimes"] and floor["vs_eager"] > 0
    assert set(floor["shapes"]) == {"1x6x4", "1x9x5", "3x6x4", "3x9x5"}
    # 1 request: the split's 1 addmm + 1 mm + 2 bmm, the attention tail's 2 and the head's 3
    assert floor["shapes"]["1x6x4"]["products"] == 9
    assert (
        floor["shapes"]["1x9x5"]["mflop_per_forward"]
        > floor["shapes"]["1x6x4"]["mflop_per_forward"]
    )
    assert [r["batch_requests"] for r in out["straightforward"]] == [1, 3]
    for r in out["straightforward"]:
        assert r["max_abs_logit_diff"] < 1e-5 and r["split_ms"] > 0


@pytest.mark.parametrize("dense", ["fp32", "int8"])
def test_side_inputs_reach_the_score_and_the_scorer_equals_forward(dense: str) -> None:
    spec = ModelSpec(categorical_sizes=(24, 7, 5), dense_features=5, action_vocab=4)
    assert ModelSpec.from_json(spec.to_json()) == spec
    legacy = {
        k: v
        for k, v in ModelSpec().to_json().items()
        if k not in spec.to_json()
        or k in ("kind", "item_dim", "id_dim", "category_dim", "attention_hidden", "mlp_hidden")
    }
    assert ModelSpec.from_json(legacy) == ModelSpec()  # configs without side keys still load
    torch.manual_seed(0)
    net = DIN(spec).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    scorer = DinScorer(net, dense=dense)  # type: ignore[arg-type]
    hist, mask, cands = _batch(3, 40, 50)
    cm = torch.ones(3, 40, dtype=torch.bool)
    side = SideArrays(
        codes=np.array([[1, 2, 3], [0, 0, 0], [23, 6, 4]]),  # [B, P]
        dense=np.random.default_rng(1).random((3, 40, 5)).astype(np.float32),  # [B, C, F]
        actions=np.random.default_rng(2).integers(0, 4, size=(3, 50)),  # [B, L]
    )
    got = scorer.score(hist, mask, cands, cm, side)
    with torch.no_grad():
        logits = net(
            hist.repeat_interleave(40, 0),
            mask.repeat_interleave(40, 0),
            cands.reshape(-1, D),
            SideInputs(
                torch.from_numpy(side.codes).repeat_interleave(40, 0),  # type: ignore[arg-type]
                torch.from_numpy(side.dense).reshape(-1, 5),  # type: ignore[arg-type]
                torch.from_numpy(side.actions).repeat_interleave(40, 0),  # type: ignore[arg-type]
            ),
        )
    atol = 1e-5 if dense == "fp32" else 5e-2
    np.testing.assert_allclose(got, torch.sigmoid(logits).view(3, 40).numpy(), atol=atol)
    for changed in (
        SideArrays(np.array([[2, 1, 0]] * 3), side.dense, side.actions),
        SideArrays(side.codes, side.dense * 3, side.actions),  # type: ignore[operator]
        SideArrays(side.codes, side.dense, (side.actions + 1) % 4),  # type: ignore[operator]
    ):
        assert np.abs(scorer.score(hist, mask, cands, cm, changed) - got).max() > 1e-4
    with pytest.raises(ValueError, match="this model needs"):
        scorer.score(hist, mask, cands, cm)


def test_weights_with_nan_or_inf_are_refused() -> None:
    """Every score of such a version would be NaN: the version is refused at load."""
    state = dense_state(_trained_like_din())
    name = next(k for k in state if not k.startswith("tables."))
    for bad in (float("nan"), float("inf")):
        broken = dict(state)
        broken[name] = state[name].clone()
        broken[name].view(-1)[0] = bad
        with pytest.raises(ArtifactError, match=f"NaN/Inf in {name}"):
            DinScorer.from_state(SPEC, broken)
    DinScorer.from_state(SPEC, state)  # the intact weights load
