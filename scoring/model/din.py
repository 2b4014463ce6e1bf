"""DIN (Deep Interest Network, Zhou et al., KDD 2018) and its BaseModel baseline.

Items are represented by ONE vector per raw item id: the item-id embedding concatenated with the
mean of the item's category (genre) embeddings (:class:`ItemTower`). At export the tower is
materialised into the item table that the embedding store serves, so the dense networks below
only ever see item vectors: ``hist [B, L, d]``, ``cand [B, d]`` (training) or ``[B, C, d]``
(serving).

* :class:`DIN`: local activation unit over ``[q, k, q-k, q*k]`` (q = candidate, k = history
  event), PReLU activations, masked, *unnormalised* weighted sum of the history (no softmax, as in
  the paper), MLP head over ``[pooled, q, pooled*q]``, one logit.
* :class:`BaseModel`: the same embeddings and head, masked *sum* pooling instead of attention.
* The serving forward of a trained DIN is :class:`scoring.model.pair_forward.PairForward`,
  served by :class:`scoring.model.scorer.DinScorer`.
* Side inputs (:class:`SideInputs`, from the version's feature spec): categorical codes and
  dense counters into the head, action codes added to the history vectors.

Masks are required arguments everywhere; padded positions never change a score (tested).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
from safetensors.torch import save as st_save
from torch import Tensor, nn
from torch.nn import functional as F

from scoring.model.features import FeatureSpec
from scoring.model.side import NO_SIDE, SideInputs, require
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
        if torch.onnx.is_in_onnx_export():
            # The same values exactly; ONNX Runtime's PRelu broadcasts the slope slowly.
            return torch.relu(x) - self.weight * torch.relu(-x)
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
