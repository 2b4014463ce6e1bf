"""DIN (Deep Interest Network, Zhou et al., KDD 2018), its BaseModel baseline, and the serving scorer.

Items are represented by ONE vector per raw item id: the item-id embedding concatenated with the
mean of the item's category (genre) embeddings (:class:`ItemTower`). At export the tower is
materialised into the item table that the embedding store serves, so the dense networks below
only ever see item vectors: ``hist [B, L, d]``, ``cand [B, d]`` (training) or ``[B, C, d]``
(serving).

* :class:`DIN`: local activation unit over ``[q, k, q-k, q*k]`` (q = candidate, k = history
  event), PReLU activations, masked, *unnormalised* weighted sum of the history (no softmax, as in
  the paper), MLP head over ``[pooled, q, pooled*q]``, one logit.
* :class:`BaseModel`: the same embeddings and head, masked *sum* pooling instead of attention.
* :class:`DinScorer`: the serving forward of a trained :class:`DIN`. All candidates of one request
  share one history, so the first attention layer ``W·[q, k, q-k, q*k] + b`` is split into
  ``(Wq+Wd)·q + b`` (per candidate), ``(Wk-Wd)·k`` (per history event, once per request) and
  ``Wp·(q*k)`` (per pair), which avoids building the ``[C, L, 4d]`` input and cuts the first
  layer's per-pair work by 4x. Equal to :meth:`DIN.forward` within 1e-5 (tested).
* ``DinScorer(net, dense="int8")``: the attention unit with int8 weights (torch's dynamic
  quantisation); the product term and the head stay fp32 (docs/benchmarks.md). A dynamic range spans
  its whole input, so the int8 forward runs one request at a time on its *valid* events and
  candidates only: the served scores equal an offline scoring with the same option (tested).
* Side inputs (:class:`SideInputs`, from the version's feature spec): categorical codes and
  dense counters into the head, action codes added to the history vectors.

Masks are required arguments everywhere; padded positions never change a score (tested).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor, nn
from torch.ao.quantization import quantize_dynamic
from torch.nn import functional as F

from scoring.model.coldstart import ColdStart, cold_start_from
from scoring.model.features import FeatureSpec
from scoring.model.side import NO_SIDE, SideArrays, SideInputs, require, side_tensors, tensor
from streamrank.errors import ArtifactError

ModelKind = Literal["din", "base"]
DenseWeights = Literal["fp32", "int8"]
DENSE_WEIGHTS: tuple[DenseWeights, ...] = ("fp32", "int8")
TABLE_PREFIX = "tables."  # small tables shipped inside the dense weights file


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of the dense network (what config.json records under ``model``)."""

    kind: ModelKind = "din"
    item_dim: int = 24  # = id_dim + category_dim
    id_dim: int = 16
    category_dim: int = 8
    attention_hidden: tuple[int, ...] = (64, 16)
    mlp_hidden: tuple[int, ...] = (64, 32)
    activation: Literal["prelu"] = "prelu"
    # Side inputs (scoring.model.features): the vocabulary size of each per-request categorical
    # input (context, user attributes), the dense counters per candidate, the action vocabulary.
    categorical_sizes: tuple[int, ...] = ()
    categorical_dim: int = 4
    dense_features: int = 0
    action_vocab: int = 0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["attention_hidden"] = list(self.attention_hidden)
        out["mlp_hidden"] = list(self.mlp_hidden)
        out["categorical_sizes"] = list(self.categorical_sizes)
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ModelSpec:
        try:
            spec = cls(
                kind=raw["kind"],
                item_dim=int(raw["item_dim"]),
                id_dim=int(raw["id_dim"]),
                category_dim=int(raw["category_dim"]),
                attention_hidden=tuple(int(h) for h in raw["attention_hidden"]),
                mlp_hidden=tuple(int(h) for h in raw["mlp_hidden"]),
                activation=raw.get("activation", "prelu"),
                categorical_sizes=tuple(int(n) for n in raw.get("categorical_sizes", ())),
                categorical_dim=int(raw.get("categorical_dim", 4)),
                dense_features=int(raw.get("dense_features", 0)),
                action_vocab=int(raw.get("action_vocab", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"config.json 'model' section is invalid: {exc!r}") from exc
        if spec.kind not in ("din", "base") or spec.activation != "prelu":
            raise ArtifactError(
                f"config.json 'model': unsupported kind/activation {spec.kind}/{spec.activation}"
            )
        if spec.item_dim != spec.id_dim + spec.category_dim or spec.item_dim <= 0:
            raise ArtifactError(
                f"config.json 'model': item_dim {spec.item_dim} != id_dim {spec.id_dim} + "
                f"category_dim {spec.category_dim}"
            )
        return spec


class PReLU(nn.Module):
    """Parametric ReLU with one slope per feature of the LAST dim (``nn.PReLU`` uses dim 1)."""

    def __init__(self, features: int, init: float = 0.1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((features,), init))

    def forward(self, x: Tensor) -> Tensor:
        # F.prelu on a 2-d view: one fused kernel instead of torch.where's several (docs/model.md).
        return F.prelu(x.reshape(-1, x.shape[-1]), self.weight).view(x.shape)


def _mlp(sizes: list[int]) -> nn.Sequential:
    """Linear+PReLU stack ending in a Linear to one output."""
    layers: list[nn.Module] = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        layers += [nn.Linear(fan_in, fan_out), PReLU(fan_out)]
    layers.append(nn.Linear(sizes[-1], 1))
    return nn.Sequential(*layers)


class ItemTower(nn.Module):
    """Item vector = [id embedding, mean of the item's category embeddings] (training only)."""

    item_genres: Tensor  # [N, G] buffer
    genre_weights: Tensor  # [N, G] buffer

    def __init__(self, *, n_items: int, item_genres: Tensor, genre_mask: Tensor, n_genres: int,
                 id_dim: int, category_dim: int) -> None:  # fmt: skip
        super().__init__()
        self.ids = nn.Embedding(n_items, id_dim)
        self.categories = nn.Embedding(n_genres, category_dim)
        nn.init.normal_(self.ids.weight, std=0.05)
        nn.init.normal_(self.categories.weight, std=0.05)
        weights = genre_mask.float() / genre_mask.float().sum(1, keepdim=True).clamp(min=1)
        self.register_buffer("item_genres", item_genres.long(), persistent=False)  # [N, G]
        self.register_buffer("genre_weights", weights, persistent=False)  # [N, G], rows sum to 1

    def forward(self, idx: Tensor) -> Tensor:
        """``idx [...]`` item indices -> ``[..., id_dim + category_dim]``."""
        cat = self.categories(self.item_genres[idx])  # [..., G, c]
        cat = (cat * self.genre_weights[idx].unsqueeze(-1)).sum(-2)  # [..., c]
        return torch.cat([self.ids(idx), cat], dim=-1)  # [..., d]

    @torch.no_grad()
    def export(self, chunk: int = 65536) -> npt.NDArray[np.float32]:
        """The materialised item table ``[n_items, d]`` (what the embedding store serves)."""
        n = self.ids.num_embeddings
        parts = [self(torch.arange(s, min(s + chunk, n))) for s in range(0, n, chunk)]
        return torch.cat(parts).numpy().astype(np.float32)


class _Head(nn.Module):
    """MLP over ``[pooled, cand, pooled*cand]`` + the categorical embeddings + dense counters."""

    offsets: Tensor  # [P] buffer: where each categorical input's rows start

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        n_side = len(spec.categorical_sizes) * spec.categorical_dim + spec.dense_features
        self.mlp = _mlp([3 * spec.item_dim + n_side, *spec.mlp_hidden])
        self.dense_features = spec.dense_features
        # All categorical inputs in one table (input i's rows start at offsets[i]): one lookup
        # per call, not one per input. Created only when configured, so side-free models keep
        # their exact initialisation.
        self.categorical = (
            nn.Embedding(sum(spec.categorical_sizes), spec.categorical_dim)
            if spec.categorical_sizes
            else None
        )
        starts = [0, *itertools.accumulate(spec.categorical_sizes)][:-1]
        self.register_buffer("offsets", torch.tensor(starts, dtype=torch.long), persistent=False)

    def forward(self, pooled: Tensor, cand: Tensor, side: SideInputs) -> Tensor:
        """``pooled, cand [..., d]`` (leading dims ``[B]`` or ``[B, C]``) -> logits ``[...]``."""
        parts = [pooled, cand, pooled * cand]
        lead = pooled.shape[:-1]
        if self.categorical is not None:
            codes = require(side.codes, "categorical codes [B, P]")
            cv = self.categorical(codes + self.offsets).flatten(-2)  # [B, P*p]
            while cv.dim() < pooled.dim():
                cv = cv.unsqueeze(-2)  # [B, 1, P*p]
            parts.append(cv.expand(*lead, cv.shape[-1]))
        if self.dense_features:
            dense = require(side.dense, "dense counters [B, C, F]")
            parts.append(dense.reshape(*lead, self.dense_features))  # [..., F]
        return self.mlp(torch.cat(parts, dim=-1)).squeeze(-1)


class _HistoryActions(nn.Module):
    """Adds each history event's action embedding to its item vector (when configured)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.table = nn.Embedding(spec.action_vocab, spec.item_dim) if spec.action_vocab else None
        if self.table is not None:
            nn.init.normal_(self.table.weight, std=0.05)

    def forward(self, hist: Tensor, side: SideInputs) -> Tensor:
        """``hist [B, L, d]`` -> ``[B, L, d]``."""
        if self.table is None:
            return hist
        actions = require(side.actions, "history actions [B, L]")
        return hist + self.table(actions[:, : hist.shape[1]])  # [B, L, d]


class DIN(nn.Module):
    """Deep Interest Network over item vectors; :meth:`forward` is the straightforward one."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.attention = _mlp([4 * spec.item_dim, *spec.attention_hidden])
        self.head = _Head(spec)
        self.actions = _HistoryActions(spec)

    def attention_weights(self, hist: Tensor, hist_mask: Tensor, cand: Tensor) -> Tensor:
        """Unnormalised activation weights ``[B, L]`` (0 at padded positions)."""
        q = cand.unsqueeze(1).expand_as(hist)  # [B, L, d]
        x = torch.cat([q, hist, q - hist, q * hist], dim=-1)  # [B, L, 4d]
        w = self.attention(x).squeeze(-1)  # [B, L]
        return torch.where(hist_mask, w, torch.zeros_like(w))  # [B, L]

    def forward(
        self, hist: Tensor, hist_mask: Tensor, cand: Tensor, side: SideInputs = NO_SIDE
    ) -> Tensor:
        """``hist [B, L, d]``, ``hist_mask [B, L]`` bool, ``cand [B, d]`` -> logits ``[B]``."""
        hist = self.actions(hist, side)  # [B, L, d]
        hist = hist.masked_fill(~hist_mask.unsqueeze(-1), 0.0)  # [B, L, d]; padding (even NaN) -> 0
        w = self.attention_weights(hist, hist_mask, cand)  # [B, L]
        pooled = (w.unsqueeze(-1) * hist).sum(1)  # [B, d]
        return self.head(pooled, cand, side)  # [B]


class BaseModel(nn.Module):
    """Embedding + masked sum pooling + the same MLP head (the paper's Base model)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.head = _Head(spec)
        self.actions = _HistoryActions(spec)

    def forward(
        self, hist: Tensor, hist_mask: Tensor, cand: Tensor, side: SideInputs = NO_SIDE
    ) -> Tensor:
        """``hist [B, L, d]``, ``hist_mask [B, L]`` bool, ``cand [B, d]`` -> logits ``[B]``."""
        hist = self.actions(hist, side)  # [B, L, d]
        pooled = hist.masked_fill(~hist_mask.unsqueeze(-1), 0.0).sum(1)  # [B, d]
        return self.head(pooled, cand, side)  # [B]


def build_net(spec: ModelSpec) -> DIN | BaseModel:
    return DIN(spec) if spec.kind == "din" else BaseModel(spec)


def _linear(weight: Tensor, bias: Tensor | None) -> nn.Linear:
    """An ``nn.Linear`` holding ``weight [out, in]`` (and ``bias [out]``)."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


class DinScorer:
    """Serving forward of a trained DIN: many candidates against one history per request.

    ``dense``: ``"fp32"`` (the trained weights) or ``"int8"`` (quantised: the module doc)."""

    cold_start: ColdStart | None = None  # the version's cold-start parts (scoring.model.coldstart)

    def __init__(
        self, net: DIN, *, dense: DenseWeights = "fp32", features: FeatureSpec | None = None
    ) -> None:
        if dense not in DENSE_WEIGHTS:
            raise ValueError(f"dense weights {dense!r}: use one of {', '.join(DENSE_WEIGHTS)}")
        net = net.eval()
        self.net = net
        self.spec = net.spec
        self.dense: DenseWeights = dense
        self.features = features or FeatureSpec()  # the inputs the version's requests need
        d = net.spec.item_dim
        first: nn.Linear = net.attention[0]  # type: ignore[assignment]
        w = first.weight.detach()  # [h, 4d] = [Wq | Wk | Wd | Wp]
        wq, wk, wd, wp = w[:, :d], w[:, d : 2 * d], w[:, 2 * d : 3 * d], w[:, 3 * d :]
        self.w_cand = (wq + wd).t().contiguous()  # [d, h]
        self.w_hist = (wk - wd).t().contiguous()  # [d, h]
        self.w_prod = wp.t().contiguous()  # [d, h]
        self.bias = first.bias.detach().clone()  # [h]
        self.rest = net.attention[1:]  # PReLU, Linear, ..., Linear(., 1)
        self._int8: nn.ModuleDict | None = None
        if dense == "int8":
            fp32 = nn.ModuleDict(
                {
                    "cand": _linear(self.w_cand.t(), self.bias),  # d -> h
                    "hist": _linear(self.w_hist.t(), None),  # d -> h
                    "rest": self.rest,
                }
            )
            with warnings.catch_warnings():
                # torch 2.13 warns that its quantised tensor types will move to torchao; they
                # still work, and the int8 option is opt-in (docs/benchmarks.md), so the warning
                # would only repeat on every model load.
                warnings.filterwarnings("ignore", message=".*quantized tensor creation functions")
                # A quantised copy: the fp32 net stays as it was.
                self._int8 = quantize_dynamic(fp32, {nn.Linear}, dtype=torch.qint8).eval()

    @classmethod
    def from_state(
        cls,
        spec: ModelSpec,
        state: Mapping[str, Tensor],
        *,
        dense: DenseWeights = "fp32",
        features: FeatureSpec | None = None,
    ) -> DinScorer:
        """Build from a dense state dict (small tables under ``tables.`` are ignored here)."""
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
        return cls(net, dense=dense, features=features)

    @classmethod
    def from_bytes(
        cls, config: Mapping[str, Any], dense: bytes, *, weights: DenseWeights = "fp32"
    ) -> DinScorer:
        """Build from config.json (parsed) and the dense safetensors bytes (as stored in Redis);
        ``weights``: serve them as fp32 or int8."""
        spec = ModelSpec.from_json(config.get("model", {}))
        try:
            state = st_load(dense)
        except Exception as exc:  # safetensors raises its own error types
            raise ArtifactError(f"dense weights are not a valid safetensors file: {exc}") from exc
        scorer = cls.from_state(spec, state, dense=weights, features=features_of(config, spec))
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
            return self._logits(hist, hist_mask, cands, side)
        parts = [
            self._logits(
                hist[i : i + step],
                hist_mask[i : i + step],
                cands[i : i + step],
                side.rows(i, i + step),
            )
            for i in range(0, b, step)
        ]
        return torch.cat(parts)  # [B, C]

    def _logits(self, hist: Tensor, hist_mask: Tensor, cands: Tensor, side: SideInputs) -> Tensor:
        hist = hist.masked_fill(~hist_mask.unsqueeze(-1), 0.0)  # [B, L, d]; padding (even NaN) -> 0
        a = torch.addmm(self.bias, cands.reshape(-1, cands.shape[-1]), self.w_cand)  # [B*C, h]
        a = a.view(cands.shape[0], cands.shape[1], 1, self.bias.shape[0])  # [B, C, 1, h]
        h = torch.matmul(hist, self.w_hist).unsqueeze(1)  # [B, 1, L, h]: once per request
        qw = cands.unsqueeze(-1) * self.w_prod  # [B, C, d, h]: diag(q)·Wp^T
        x = torch.matmul(hist.unsqueeze(1), qw)  # [B, C, L, h]: Wp·(q*k) for every pair
        x += a
        x += h
        w = self.rest(x).squeeze(-1)  # [B, C, L]
        w = w * hist_mask.unsqueeze(1)  # [B, C, L]
        pooled = torch.matmul(w, hist)  # [B, C, d]
        return self.net.head(pooled, cands, side)  # [B, C]

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
                qw = cv.unsqueeze(-1) * self.w_prod  # [1, c, d, h]: product term stays fp32
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


def features_of(config: Mapping[str, Any], spec: ModelSpec) -> FeatureSpec:
    """The feature spec of a version's config, checked against its model's input sizes."""
    length = int(config.get("train", {}).get("history_len", 50))
    features = FeatureSpec.from_json(
        config.get("feature_spec", {}).get("inputs"), default_length=length
    )
    expected = (
        tuple(n for _, n in features.categorical),
        len(features.counters),
        len(features.actions) + 1 if features.actions else 0,
    )
    if expected != (spec.categorical_sizes, spec.dense_features, spec.action_vocab):
        raise ArtifactError(
            f"config.json: the feature spec's inputs {expected} (categorical sizes, counters, "
            f"actions) do not match the model's {spec.categorical_sizes, spec.dense_features, spec.action_vocab}"
        )
    return features


def dense_state(net: nn.Module, category_table: Tensor | None = None) -> dict[str, Tensor]:
    """The dense weights to ship: the net's parameters plus small tables under ``tables.``."""
    state = {k: v.detach().contiguous().clone() for k, v in net.state_dict().items()}
    if category_table is not None:
        state[f"{TABLE_PREFIX}category"] = category_table.detach().contiguous().clone()
    return state


def dense_bytes(state: Mapping[str, Tensor]) -> bytes:
    """Safetensors bytes (no pickle) of a dense state dict."""
    return st_save(dict(state))
