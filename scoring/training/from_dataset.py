"""Training DIN on samples exported from the served log, alone or warm-started from a version.

The item vectors are trained per id directly (the served log carries ids, not categories): the
table starts from the warm-start version's rows (an item it does not know starts at the vector
it was served with: its cold-start vector when the samples logged categories for it, else the
OOV row), or at random without one. The dense weights start from the version's, its feature
spec is kept (so the side inputs mean what they meant when served) and its cold-start parts
(category table and vocabulary, new-item vector) are shipped on, so the new version can still
cold-start items it has never seen. Without a warm start the spec is the sequence, plus the
counters when every sample logged them. The last ``valid_share`` of the requests by time are
held out; every epoch is scored on them through the serving path, and the best on validation
GAUC becomes the version. Zero epochs export the warm-start version's model under a new id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from safetensors.torch import load as st_load
from torch import Tensor, nn
from tqdm import tqdm

from scoring.model.artifact import Artifact, save_artifact
from scoring.model.coldstart import NEW_ITEM_TABLE, ColdStart
from scoring.model.din import DIN, TABLE_PREFIX, ModelSpec, dense_state
from scoring.model.features import FeatureSpec
from scoring.model.scorer import DinScorer
from scoring.model.side import SideInputs
from scoring.training.served_data import DatasetInfo, ServedSample, summary, time_split
from scoring.training.served_eval import (
    Batch,
    ServedModel,
    build_batch,
    evaluate_on_samples,
    missing_inputs,
)
from scoring.training.train import seed_everything

logger = logging.getLogger(__name__)
IntPair = npt.NDArray[np.int64]


@dataclass(frozen=True)
class DatasetTrainConfig:
    """Hyper-parameters of a training run on served samples."""

    epochs: int = 3
    batch_size: int = 256  # impressions per step
    lr: float = 1e-3
    seed: int = 17
    valid_share: float = 0.2  # the last share of the requests by time, held out
    threads: int = 1
    encoding: str = "int8"  # the item table's default encoding (how validation is scored)
    history_len: int = 50  # without a warm start: the spec's history length
    bucket_s: tuple[int, int] = (300, 3600)  # without a warm start: the counters' buckets
    spec: ModelSpec = field(default_factory=ModelSpec)  # without a warm start: the dims
    negatives: int | None = None  # non-clicked items kept per clicked one (None: all)

    def to_json(self) -> dict[str, Any]:
        return {
            "epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr,
            "seed": self.seed, "valid_share": self.valid_share, "threads": self.threads,
            "history_len": self.history_len, "bucket_s": list(self.bucket_s),
            "negatives": self.negatives,
        }  # fmt: skip


class TableRanker(nn.Module):
    """An item table trained per id, and the dense net on its vectors."""

    def __init__(self, table: npt.NDArray[np.float32], net: DIN) -> None:
        super().__init__()
        self.items = nn.Embedding.from_pretrained(torch.from_numpy(table.copy()), freeze=False)
        self.net = net

    def forward(self, hist: Tensor, hist_mask: Tensor, cand: Tensor, side: SideInputs) -> Tensor:
        """``hist [B, L]``, ``hist_mask [B, L]``, ``cand [B]`` item rows -> logits ``[B]``."""
        out: Tensor = self.net(self.items(hist), hist_mask, self.items(cand), side)
        return out


@dataclass
class Start:
    """Where training starts: the model, its inputs, its vocabulary and what ships beside it."""

    ranker: TableRanker
    features: FeatureSpec
    item_ids: list[str]
    category_table: Tensor | None
    warm: Artifact | None
    cold: ColdStart | None = None  # the warm-start version's cold-start parts, shipped on


def vocabulary(samples: Sequence[ServedSample], warm: Artifact | None) -> list[str]:
    """The warm-start version's items in its order, then the samples' other items."""
    known = list(warm.item_ids) if warm is not None else []
    seen = set(known)
    new = {i for s in samples for i in (*s.items, *s.history_items)} - seen
    return known + sorted(new, key=lambda s: (len(s), s))


def cold_features(samples: Sequence[ServedSample], cfg: DatasetTrainConfig) -> FeatureSpec:
    """The sequence, plus the counters when every sample logged them."""
    counters = bool(samples) and all(s.counters is not None for s in samples)
    return FeatureSpec(
        families=("sequence", "counters") if counters else ("sequence",),
        sequence_length=cfg.history_len,
        windows={"1h": cfg.bucket_s[0], "24h": cfg.bucket_s[1]} if counters else {},
    )


def start_from(
    samples: Sequence[ServedSample], cfg: DatasetTrainConfig, warm: Artifact | None
) -> Start:
    """The initial model: the warm-start version's weights and rows, or a fresh one."""
    item_ids = vocabulary(samples, warm)
    torch.manual_seed(cfg.seed)
    if warm is None:
        features = cold_features(samples, cfg)
        spec = replace(cfg.spec, kind="din", categorical_sizes=(), action_vocab=0,
                       dense_features=len(features.counters))  # fmt: skip
        net = DIN(spec)
        rng = np.random.default_rng(cfg.seed)
        table = rng.normal(0, 0.05, (len(item_ids), spec.item_dim)).astype(np.float32)
        return Start(TableRanker(table, net), features, item_ids, None, None)
    state = st_load(warm.dense)
    net = DIN(warm.spec)
    net.load_state_dict({k: v for k, v in state.items() if not k.startswith(TABLE_PREFIX)})
    table = np.repeat(warm.oov_row[None], len(item_ids), axis=0)  # new items: the OOV row
    table[: len(warm.item_ids)] = warm.item_table
    scorer = warm.scorer()
    if scorer.cold_start is not None:  # new items served cold: their cold vectors
        row = {item: r for r, item in enumerate(item_ids)}
        for item, vector in served_cold(samples, set(warm.item_ids), scorer.cold_start).items():
            table[row[item]] = vector
    category = state.get(f"{TABLE_PREFIX}category")
    return Start(TableRanker(table, net), scorer.features, item_ids, category, warm,
                 scorer.cold_start)  # fmt: skip


def served_cold(
    samples: Sequence[ServedSample], known: Collection[str], cold: ColdStart
) -> dict[str, npt.NDArray[np.float32]]:
    """The cold vectors (by ``cold``) of the items not in ``known`` that the samples logged
    categories for; an item logged with different categories over time takes its latest."""
    latest: dict[str, tuple[str, ...]] = {}
    for s in sorted(samples, key=lambda s: (s.served_at, s.request_id)):
        for item, logged in (s.cold_start or {}).items():
            names = cold.used(logged)
            if item not in known and names:
                latest[item] = tuple(names)
    if not latest:
        return {}
    vectors = cold.vectors(list(latest.values()))
    return dict(zip(latest, vectors, strict=True))


@dataclass
class DatasetTrainResult:
    """The trained model and what the artifact records about the run."""

    ranker: TableRanker
    features: FeatureSpec
    item_ids: list[str]
    category_table: Tensor | None
    warm_version: str | None
    metrics: dict[str, Any]
    cold: ColdStart | None = None  # the warm-start version's cold-start parts

    def served(self, encoding: str) -> ServedModel:
        """The trained version as it would be served."""
        table = self.ranker.items.weight.detach().numpy().astype(np.float32)
        scorer = DinScorer(self.ranker.net, features=self.features)
        scorer.cold_start = self.cold
        return ServedModel.from_parts(
            "trained", scorer, self.item_ids, table, table.mean(0), encoding
        )


def _flat(batch: Batch) -> tuple[IntPair, IntPair]:
    """Every real (sample, candidate) position."""
    rows, cols = np.nonzero(batch.cand_mask)
    return rows.astype(np.int64), cols.astype(np.int64)


def keep_negatives(
    pairs: tuple[IntPair, IntPair], labels: npt.NDArray[np.float32], per_click: int, seed: int
) -> tuple[IntPair, IntPair]:
    """Every clicked impression and, per request, ``per_click`` times as many non-clicked ones
    drawn at random (a request without a click keeps none): the positive share the warm-start
    version was trained at, not the served lists' one click in a hundred."""
    rng = np.random.default_rng(seed)
    rows = pairs[0]
    keep = labels > 0  # [P]
    clicks = np.bincount(rows[keep], minlength=int(rows.max(initial=-1)) + 1)  # [B]
    order = rng.permutation(len(rows))  # a random rank among each request's negatives
    negative = order[~keep[order]]
    seen = np.zeros_like(clicks)
    for p in negative.tolist():
        r = rows[p]
        if seen[r] < per_click * clicks[r]:
            seen[r] += 1
            keep[p] = True
    where = np.flatnonzero(keep)
    return rows[where], pairs[1][where]


def _step_inputs(
    batch: Batch, si: IntPair, ci: IntPair
) -> tuple[Tensor, Tensor, Tensor, SideInputs]:
    """One step's ``hist [b, L']``, ``mask``, ``cand [b]`` and side inputs."""
    mask = batch.hist_mask[si]
    width = max(int(mask.sum(1).max(initial=0)), 1)
    side = batch.side
    codes = dense = actions = None
    if side is not None:
        codes = None if side.codes is None else torch.from_numpy(side.codes[si])
        dense = None if side.dense is None else torch.from_numpy(side.dense[si, ci])  # [b, F]
        actions = None if side.actions is None else torch.from_numpy(side.actions[si, :width])
    return (torch.from_numpy(batch.hist[si, :width]), torch.from_numpy(mask[:, :width]),
            torch.from_numpy(batch.cand[si, ci]), SideInputs(codes, dense, actions))  # fmt: skip


def _epoch(ranker: TableRanker, batch: Batch, labels: Tensor, opt: Any, order: IntPair,
           pairs: tuple[IntPair, IntPair], cfg: DatasetTrainConfig, bar: tqdm) -> float:  # fmt: skip
    """One pass over the impressions in ``order``; the mean BCE loss."""
    loss_fn = nn.BCEWithLogitsLoss()
    ranker.train()
    total = 0.0
    for s in range(0, len(order), cfg.batch_size):
        idx = order[s : s + cfg.batch_size]
        si, ci = pairs[0][idx], pairs[1][idx]
        hist, mask, cand, side = _step_inputs(batch, si, ci)
        loss = loss_fn(ranker(hist, mask, cand, side), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += float(loss.detach()) * len(idx)
        bar.update(1)
    return total / max(1, len(order))


def train_from_samples(
    samples: Sequence[ServedSample],
    cfg: DatasetTrainConfig,
    *,
    warm: Artifact | None = None,
    progress: bool = True,
) -> DatasetTrainResult:
    """Fit on the first requests by time, validate on the last ``valid_share``; the process-wide
    torch settings it changes are restored."""
    deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    try:
        seed_everything(cfg.seed, cfg.threads)
        return _train(samples, cfg, warm, progress)
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)


def _train(samples: Sequence[ServedSample], cfg: DatasetTrainConfig, warm: Artifact | None,
           progress: bool) -> DatasetTrainResult:  # fmt: skip
    started = time.perf_counter()
    start = start_from(samples, cfg, warm)
    usable = [s for s in samples if missing_inputs(start.features, s) is None]
    train, valid = time_split(usable, cfg.valid_share)
    if not train:
        raise ValueError(
            f"no training samples: {len(samples)} in the dataset, {len(usable)} with the inputs "
            "the model needs; export more requests (or a longer --since)"
        )
    row = {item: r for r, item in enumerate(start.item_ids)}
    batch = build_batch(train, start.features, row.__getitem__)
    pairs = _flat(batch)
    flat = np.array([train[i].labels[j] for i, j in zip(*pairs, strict=True)], np.float32)  # [P]
    if cfg.negatives is not None:
        pairs = keep_negatives(pairs, flat, cfg.negatives, cfg.seed)
        flat = np.array([train[i].labels[j] for i, j in zip(*pairs, strict=True)], np.float32)
    labels = torch.from_numpy(flat)
    ranker = start.ranker
    result = DatasetTrainResult(ranker, start.features, start.item_ids, start.category_table,
                                warm.version if warm else None, {}, start.cold)  # fmt: skip
    opt = torch.optim.Adam(ranker.parameters(), lr=cfg.lr)
    generator = torch.Generator().manual_seed(cfg.seed)
    log: list[dict[str, Any]] = []
    best: tuple[float, int, dict[str, Tensor]] | None = None
    steps = -(-len(pairs[0]) // cfg.batch_size) * cfg.epochs
    with tqdm(total=steps, desc="train", unit="batch", disable=not progress) as bar:
        for epoch in range(1, cfg.epochs + 1):
            order = torch.randperm(len(pairs[0]), generator=generator).numpy()
            loss = _epoch(ranker, batch, labels, opt, order, pairs, cfg, bar)
            entry = {"epoch": epoch, "train_loss": round(loss, 5),
                     **_valid(result, valid, cfg.encoding)}  # fmt: skip
            log.append(entry)
            logger.info("from-dataset epoch %d: %s", epoch, entry)
            gauc = entry.get("gauc")
            key = gauc if gauc is not None else -loss
            if best is None or key > best[0]:
                best = (key, epoch, {k: v.detach().clone() for k, v in ranker.state_dict().items()})
    if best is not None:
        ranker.load_state_dict(best[2])
    ranker.eval()
    result.metrics = {
        "valid": _valid(result, valid, cfg.encoding),
        "valid_warm_start": evaluate_on_samples(warm, valid) if warm and valid else None,
        "best_epoch": best[1] if best else 0,
        "epochs": log,
        "samples": {**summary(samples), "usable": len(usable), "train": len(train),
                    "valid": len(valid), "impressions_train": len(pairs[0])},
        "items": {"vocabulary": len(start.item_ids),
                  "from_warm_start": len(warm.item_ids) if warm else 0},
        "train_seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    return result


def _valid(
    result: DatasetTrainResult, valid: Sequence[ServedSample], encoding: str
) -> dict[str, Any]:
    """The model's metrics on the held-out requests, through the serving path."""
    if not valid:
        return {"n": 0}
    report = evaluate_on_samples(result.served(encoding), valid)
    result.ranker.train()
    return {k: v for k, v in report.items() if k != "version"}


def export_from_dataset(
    result: DatasetTrainResult, cfg: DatasetTrainConfig, dataset: DatasetInfo, out_dir: Path
) -> Path:
    """Write the version's artifact; config.json records the dataset and the warm start."""
    table = result.ranker.items.weight.detach().numpy().astype(np.float32)
    net = result.ranker.net
    feature_spec = {
        "item": {
            "table": "item",
            "key": "raw item id string",
            "vector": [f"item vector trained per id [{net.spec.item_dim}]"],
            "oov": "mean of all item vectors",
        },
        "history": {
            "max_len": result.features.sequence_length,
            "order": "(ts, event_id) ascending, oldest first; as served",
        },
        "candidate": "one item vector per candidate; C candidates share one history",
        "inputs": result.features.to_json(),
    }
    state = dense_state(net, result.category_table)
    if result.cold is not None:  # the warm-start version's cold-start parts, shipped on
        state[NEW_ITEM_TABLE] = torch.from_numpy(np.ascontiguousarray(result.cold.new_item))
        vocab = sorted(result.cold.vocabulary, key=result.cold.vocabulary.__getitem__)
        feature_spec["category"] = {"source": "the warm-start version's", "combine": "mean",
                                    "vocabulary": vocab}  # fmt: skip
    train = {
        **cfg.to_json(),
        "history_len": result.features.sequence_length,
        "from_dataset": True,
        "warm_start": result.warm_version,
    }
    return save_artifact(
        out_dir,
        spec=net.spec,
        dense_state=state,
        item_ids=list(result.item_ids),
        item_table=table,
        oov_row=table.mean(axis=0),
        encoding=cfg.encoding,
        feature_spec=feature_spec,
        data=dataset.to_json(),
        metrics=result.metrics,
        train=train,
    )
