"""Training and offline evaluation of DIN, BaseModel and Popularity (CPU, deterministic).

One pipeline for MovieLens and the synthetic data: :func:`train_and_evaluate` fits, on the same
samples and from the same seed, BaseModel and DIN with the configured feature families and DIN
on the sequence alone; each keeps its epoch with the best validation GAUC, and the DIN variant
with the better validation GAUC becomes the version. DIN's test scores come from the SERVING path
(materialised item table -> :class:`~scoring.model.din.DinScorer`), the same code the scoring
worker runs, and again after the item table goes through each store encoding.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn
from tqdm import tqdm

from scoring.embeddings.codec import ENCODINGS, roundtrip
from scoring.model.din import DIN, ItemTower, ModelSpec, build_net
from scoring.model.features import COUNTERS, FAMILIES, FeatureSpec
from scoring.model.scorer import DinScorer
from scoring.model.side import SideArrays, SideInputs
from scoring.training.coldstart_fit import fit_new_item
from scoring.training.data import Dataset, Samples, Split, attribute_vocab, build_samples
from scoring.training.evaluation import auc, gauc
from scoring.training.fullrank import (
    RetrievalRun,
    TrainedRetriever,
    cascade_goals,
    din_model,
    run_protocol,
)
from scoring.training.negatives import NegativeMix, with_towers
from scoring.training.pointintime import LogIndex, side_values
from scoring.training.timesplit import TimeSplit, build_time_split
from scoring.training.twotower import RetrievalConfig
from streams.windows import Window

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters; the defaults train ml-100k on a CPU in minutes (docs/model.md)."""

    epochs: int = 3
    batch_size: int = 256
    lr: float = 2e-3
    seed: int = 17
    history_len: int = 50
    n_negatives: int = 20
    threads: int = 1
    families: tuple[str, ...] = FAMILIES  # feature families of the featured models
    bucket_s: tuple[int, int] = (300, 3600)  # counter buckets of the 1 h and 24 h windows
    select: Literal["best", "features", "sequence"] = "best"  # which DIN becomes the version
    patience: int | None = None  # stop after this many epochs without a better validation GAUC
    time_split: bool = True  # also fit and report the time-split protocol
    sequence_baseline: bool = True  # also fit DIN on the sequence alone (the features' baseline)
    train_negatives: NegativeMix = field(default_factory=NegativeMix)  # per train positive
    spec: ModelSpec = field(default_factory=ModelSpec)
    # the two-tower retrieval model and the full-ranking figures; None: neither
    retrieval: RetrievalConfig | None = field(default_factory=RetrievalConfig)

    def to_json(self) -> dict[str, Any]:
        return {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "seed": self.seed,
            "history_len": self.history_len,
            "n_negatives": self.n_negatives,
            "threads": self.threads,
            "families": list(self.families),
            "bucket_s": list(self.bucket_s),
            "select": self.select,
            "patience": self.patience,
            "time_split": self.time_split,
            "sequence_baseline": self.sequence_baseline,
            "train_negatives": self.train_negatives.to_json(),
            "retrieval": self.retrieval.to_json() if self.retrieval else None,
        }

    @property
    def windows(self) -> dict[str, Window]:
        return {
            "1h": Window("1h", 3600, self.bucket_s[0]),
            "24h": Window("24h", 86400, self.bucket_s[1]),
        }


def seed_everything(seed: int, threads: int) -> None:
    """Deterministic CPU training: fixed seeds, deterministic kernels, fixed thread count."""
    torch.manual_seed(seed)
    np.random.seed(seed)  # nothing here uses it, but third-party code might
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)


def feature_spec_for(ds: Dataset, cfg: TrainConfig, families: tuple[str, ...]) -> FeatureSpec:
    """The spec of a model with these families on this data (families the data cannot feed,
    such as attributes of a log without users, are left out)."""
    attributes = attribute_vocab(ds) if "attributes" in families else {}
    kept = tuple(f for f in families if f != "attributes" or attributes)
    return FeatureSpec(
        families=kept,
        sequence_length=cfg.history_len,
        windows={name: w.resolution_s for name, w in cfg.windows.items()},
        user_attributes=attributes,
    )


def model_spec_for(cfg: TrainConfig, fspec: FeatureSpec, kind: str) -> ModelSpec:
    return ModelSpec.from_json(
        {
            **cfg.spec.to_json(),
            "kind": kind,
            "categorical_sizes": [n for _, n in fspec.categorical],
            "dense_features": len(fspec.counters),
            "action_vocab": len(fspec.actions) + 1 if fspec.actions else 0,
        }
    )


class Ranker(nn.Module):
    """Item tower + dense net, on item indices (training and offline evaluation)."""

    def __init__(self, tower: ItemTower, net: nn.Module, features: FeatureSpec) -> None:
        super().__init__()
        self.tower = tower
        self.net = net
        self.features = features

    def forward(
        self, hist_idx: Tensor, hist_mask: Tensor, cand_idx: Tensor, side: SideInputs
    ) -> Tensor:
        """``hist_idx [B, L]``, ``hist_mask [B, L]`` bool, ``cand_idx [B]`` -> logits ``[B]``."""
        result: Tensor = self.net(self.tower(hist_idx), hist_mask, self.tower(cand_idx), side)
        return result


def make_ranker(ds: Dataset, spec: ModelSpec, features: FeatureSpec) -> Ranker:
    tower = ItemTower(
        n_items=len(ds.items),
        item_genres=torch.from_numpy(ds.item_genres),
        genre_mask=torch.from_numpy(ds.genre_mask),
        n_genres=len(ds.genres),
        id_dim=spec.id_dim,
        category_dim=spec.category_dim,
    )
    return Ranker(tower, build_net(spec), features)


@dataclass(frozen=True)
class Inputs:
    """Samples with their side inputs (as the model takes them) and raw feature values."""

    samples: Samples
    side: SideArrays
    raw: dict[str, Any]

    def batch(self, idx: npt.NDArray[np.int64], *, repeat: int = 1) -> tuple[Tensor, ...]:
        """``hist [b*r, L']``, ``mask [b*r, L']`` cut to the longest real history, and the side
        inputs of the chosen rows, each row repeated ``repeat`` times (one per candidate)."""
        mask = self.samples.hist_mask[idx]  # [b, L]
        width = max(int(mask.sum(1).max()), 1)
        hist = torch.from_numpy(self.samples.hist[idx, :width]).repeat_interleave(repeat, 0)
        out_mask = torch.from_numpy(mask[:, :width]).repeat_interleave(repeat, 0)
        return hist, out_mask

    def side_inputs(self, idx: npt.NDArray[np.int64], *, repeat: int = 1) -> SideInputs:
        codes = dense = None
        if self.side.codes is not None:
            codes = torch.from_numpy(self.side.codes[idx]).repeat_interleave(repeat, 0)
        if self.side.dense is not None:
            dense = torch.from_numpy(self.side.dense[idx]).reshape(-1, len(COUNTERS))
        return SideInputs(codes=codes, dense=dense)

    def side_rows(self, idx: npt.NDArray[np.int64]) -> SideArrays:
        s = self.side
        return SideArrays(
            None if s.codes is None else s.codes[idx], None if s.dense is None else s.dense[idx]
        )


def inputs_for(
    ds: Dataset, split: Split, fspec: FeatureSpec, cfg: TrainConfig, index: LogIndex | None
) -> dict[str, Inputs]:
    """Each part of the split with its point-in-time side inputs."""
    out = {}
    for name in ("train", "valid", "test"):
        samples = getattr(split, name)
        side, raw = side_values(ds, samples, fspec, windows=cfg.windows, index=index)
        out[name] = Inputs(samples, side, raw)
    return out


@torch.no_grad()
def eval_logits(ranker: Ranker, inputs: Inputs, batch_users: int = 256) -> npt.NDArray[np.float32]:
    """Straightforward-forward logits ``[U, C]`` of evaluation samples."""
    ranker.eval()
    samples = inputs.samples
    n_users, n_cands = samples.cand.shape
    out = np.zeros((n_users, n_cands), dtype=np.float32)
    for s in range(0, n_users, batch_users):
        idx = np.arange(s, min(s + batch_users, n_users))
        hist, mask = inputs.batch(idx, repeat=n_cands)  # [b*C, L]
        cand = torch.from_numpy(samples.cand[idx]).reshape(-1)  # [b*C]
        logits = ranker(hist, mask, cand, inputs.side_inputs(idx, repeat=n_cands))  # [b*C]
        out[idx] = logits.view(len(idx), n_cands).numpy()
    return out


def serving_scores(
    scorer: DinScorer, table: npt.NDArray[np.float32], inputs: Inputs, batch_users: int = 64
) -> npt.NDArray[np.float32]:
    """Probabilities ``[U, C]`` through the serving scorer, item vectors taken from ``table``."""
    samples = inputs.samples
    n_users, n_cands = samples.cand.shape
    out = np.zeros((n_users, n_cands), dtype=np.float32)
    for s in range(0, n_users, batch_users):
        idx = np.arange(s, min(s + batch_users, n_users))
        hist_idx, mask = inputs.batch(idx)
        hist = table[hist_idx.numpy()]  # [b, L, d]
        cands = table[samples.cand[idx]]  # [b, C, d]
        out[idx] = scorer.score(
            hist, mask.numpy(), cands, np.ones(cands.shape[:2], dtype=bool), inputs.side_rows(idx)
        )
    return out


def fit(
    ranker: Ranker, data: dict[str, Inputs], cfg: TrainConfig, *, name: str, bar: tqdm | None = None
) -> dict[str, Any]:
    """Train with Adam on BCE; keep the epoch with the best validation GAUC. Returns the log."""
    generator = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(ranker.parameters(), lr=cfg.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    train, valid = data["train"], data["valid"]
    labels = torch.from_numpy(train.samples.label)
    best: tuple[float, int, dict[str, Tensor]] | None = None
    log: list[dict[str, float]] = []
    for epoch in range(cfg.epochs):
        ranker.train()
        order = torch.randperm(len(train.samples), generator=generator).numpy()
        total = 0.0
        for s in range(0, len(order), cfg.batch_size):
            idx = order[s : s + cfg.batch_size]
            hist, mask = train.batch(idx)
            cand = torch.from_numpy(train.samples.cand[idx])  # [B]
            logits = ranker(hist, mask, cand, train.side_inputs(idx))  # [B]
            loss = loss_fn(logits, labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            if bar is not None:
                bar.update(1)
        scores = eval_logits(ranker, valid)
        entry = {
            "epoch": epoch + 1,
            "train_loss": round(total / len(order), 5),
            "valid_auc": round(auc(valid.samples.label, scores), 5),
            "valid_gauc": round(gauc(valid.samples.label, scores), 5),
        }
        log.append(entry)
        logger.info("%s epoch %d: %s", name, epoch + 1, entry)
        if best is None or entry["valid_gauc"] > best[0]:
            state = {k: v.detach().clone() for k, v in ranker.state_dict().items()}
            best = (entry["valid_gauc"], epoch + 1, state)
        elif cfg.patience is not None and epoch + 1 - best[1] >= cfg.patience:
            break  # validation stopped improving
    assert best is not None
    ranker.load_state_dict(best[2])
    ranker.eval()
    return {"best_epoch": best[1], "best_valid_gauc": best[0], "epochs": log}


@dataclass
class TrainResult:
    """Everything the CLI needs to write the artifact and the report."""

    din: Ranker  # the DIN variant that became the version
    base: Ranker
    split: Split
    test_inputs: Inputs  # the version's test samples with their side inputs and raw values
    item_table: npt.NDArray[np.float32]  # [n_items, d] DIN's materialised item vectors
    test_scores: dict[str, npt.NDArray[np.float32]]  # model -> [U, C]
    metrics: dict[str, Any]
    retrieval: RetrievalRun | None = None  # the version's retrieval model (leave-last-out)
    new_item: npt.NDArray[np.float32] | None = None  # the cold-start id vector [id_dim]


def _metric_pair(labels: npt.NDArray[np.float32], scores: npt.NDArray[Any]) -> dict[str, float]:
    return {"auc": round(auc(labels, scores), 5), "gauc": round(gauc(labels, scores), 5)}


def train_and_evaluate(ds: Dataset, cfg: TrainConfig, *, progress: bool = True) -> TrainResult:
    """Build samples, fit the models, evaluate them on the test candidates.

    The process-wide torch settings it changes (deterministic kernels, threads) are restored.
    """
    deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    try:
        return _train_and_evaluate(ds, cfg, progress=progress)
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)


def variants(cfg: TrainConfig) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The models fitted: name -> (kind, feature families)."""
    out = {"base": ("base", cfg.families), "din": ("din", cfg.families)}
    if cfg.families != ("sequence",) and cfg.sequence_baseline:
        out["din_sequence"] = ("din", ("sequence",))
    return out


def fit_variants(
    ds: Dataset, split: Split, cfg: TrainConfig, *, bar: tqdm | None, index: LogIndex | None
) -> tuple[dict[str, Ranker], dict[str, dict[str, Inputs]], dict[str, Any]]:
    """Every variant fitted on ``split`` from the same seed: rankers, inputs, training logs."""
    rankers: dict[str, Ranker] = {}
    inputs: dict[str, dict[str, Inputs]] = {}
    logs: dict[str, Any] = {}
    for name, (kind, families) in variants(cfg).items():
        fspec = feature_spec_for(ds, cfg, families)
        inputs[name] = inputs_for(ds, split, fspec, cfg, index)
        torch.manual_seed(cfg.seed)  # same initial embeddings for every model
        rankers[name] = make_ranker(ds, model_spec_for(cfg, fspec, kind), fspec)
        logs[name] = fit(rankers[name], inputs[name], cfg, name=name, bar=bar)
    return rankers, inputs, logs


def test_metrics(
    split: Split, rankers: dict[str, Ranker], inputs: dict[str, dict[str, Inputs]]
) -> tuple[dict[str, npt.NDArray[np.float32]], dict[str, dict[str, float]]]:
    """Every model's test scores (the training forward; Popularity = train counts), metrics."""
    test = split.test
    scores = {"popularity": split.train_item_counts[test.cand].astype(np.float32)}
    for name, ranker in rankers.items():
        scores[name] = eval_logits(ranker, inputs[name]["test"])
    return scores, {name: _metric_pair(test.label, s) for name, s in scores.items()}


def _time_split(ds: Dataset, cfg: TrainConfig, bar: tqdm, index: LogIndex | None) -> dict[str, Any]:
    """The time-split protocol's metrics, or why it could not run on this data."""
    started = time.perf_counter()
    built: TimeSplit = build_time_split(
        ds, history_len=cfg.history_len, n_negatives=cfg.n_negatives, seed=cfg.seed
    )
    found = {"cutoff_ms": built.cutoff_ms, "counts": built.counts}
    if min(len(built.train), len(built.valid), len(built.test)) == 0:
        return {**found, "not_run": "a split is empty: too few users active across the cutoff"}
    split, towers = with_towers(ds, built, cfg.train_negatives, _retrieval_config(cfg),
                                seed=cfg.seed, before_ms=built.cutoff_ms, progress=not bar.disable)  # fmt: skip
    rankers, inputs, logs = fit_variants(ds, split, cfg, bar=bar, index=index)
    _, metrics = test_metrics(split, rankers, inputs)
    full = _full_ranking(ds, split, rankers[select_din(cfg, logs)], cfg, index, towers,
                         not bar.disable)  # fmt: skip
    return {
        **found,
        "test": metrics,
        "full_ranking": full.report if full else None,
        "best_epoch": {name: log["best_epoch"] for name, log in logs.items()},
        "samples": {
            "train": len(split.train),
            "test_users": len(split.test),
            "candidates_per_user": int(split.test.cand.shape[1]),
        },
        "seconds": round(time.perf_counter() - started, 1),
    }


def _retrieval_config(cfg: TrainConfig) -> RetrievalConfig | None:
    if cfg.retrieval is None:
        return None
    spec = replace(cfg.retrieval.spec, history_len=cfg.history_len)  # the DIN's history cut
    return replace(cfg.retrieval, spec=spec)


def _full_ranking(
    ds: Dataset, split: Split, ranker: Ranker, cfg: TrainConfig, index: LogIndex | None,
    towers: TrainedRetriever | None, progress: bool,
) -> RetrievalRun | None:  # fmt: skip
    """Every method ranked over all items with the split's towers (DIN: the split's selected
    variant, through the serving scorer)."""
    rcfg = _retrieval_config(cfg)
    if rcfg is None:
        return None
    assert isinstance(ranker.net, DIN)
    din = din_model(ranker.net, ranker.tower.export(), ranker.features, cfg.windows, index)
    return run_protocol(ds, split, din, rcfg, seed=cfg.seed, progress=progress, towers=towers)


def _train_and_evaluate(ds: Dataset, cfg: TrainConfig, *, progress: bool) -> TrainResult:
    started = time.perf_counter()
    seed_everything(cfg.seed, cfg.threads)
    split = build_samples(
        ds, history_len=cfg.history_len, n_negatives=cfg.n_negatives, seed=cfg.seed
    )
    if len(split.train) == 0 or len(split.test) == 0:
        raise ValueError("not enough data: every user needs at least 4 events")
    split, towers = with_towers(ds, split, cfg.train_negatives, _retrieval_config(cfg),
                                seed=cfg.seed, before_ms=None, progress=progress)  # fmt: skip
    index = LogIndex.build(ds) if "counters" in cfg.families else None
    batches = -(-len(split.train) // cfg.batch_size) * cfg.epochs * len(variants(cfg))
    with tqdm(total=batches * (1 + cfg.time_split), desc="train", unit="batch",
              disable=not progress) as bar:  # fmt: skip
        rankers, inputs, logs = fit_variants(ds, split, cfg, bar=bar, index=index)
        train_s = time.perf_counter() - started
        time_split = _time_split(ds, cfg, bar, index) if cfg.time_split else None
    other_s = time.perf_counter() - started - train_s
    chosen = select_din(cfg, logs)
    test = split.test
    scores, test_by_model = test_metrics(split, rankers, inputs)
    din_net = rankers[chosen].net
    assert isinstance(din_net, DIN)
    scorer = DinScorer(din_net)
    table = rankers[chosen].tower.export()  # [n_items, d]
    forward_probs = 1.0 / (1.0 + np.exp(-scores[chosen].astype(np.float64)))
    served = serving_scores(scorer, table, inputs[chosen]["test"])
    test_by_model[chosen] = _metric_pair(test.label, served)  # the version: the serving path
    by_encoding = {
        enc: round(auc(test.label, serving_scores(scorer, roundtrip(table, enc), inputs[chosen]["test"])), 5)
        for enc in ENCODINGS
    }  # fmt: skip
    metrics: dict[str, Any] = {
        "test": test_by_model,
        "selected": chosen,
        "auc_by_encoding": by_encoding,
        "serving_vs_forward_max_abs_diff": float(np.abs(served - forward_probs).max()),
        "training": logs,
        "samples": {
            "train": len(split.train),
            "valid_users": len(split.valid),
            "test_users": len(test),
            "candidates_per_user": int(test.cand.shape[1]),
        },
        "time_split": time_split,
        "train_seconds": round(train_s, 1),
        "eval_seconds": round(time.perf_counter() - started - train_s - other_s, 1),
    }
    retrieval = _full_ranking(ds, split, rankers[chosen], cfg, index, towers, progress)
    metrics["full_ranking"] = {
        "leave_last_out": retrieval.report if retrieval else None,
        "time_split": (time_split or {}).pop("full_ranking", None),
    }
    metrics["goals"] = {
        **goals(metrics["test"], chosen, by_encoding, time_split),
        **cascade_goals(metrics["full_ranking"]),
    }
    version_scores = {"din": served, "base": scores["base"], "popularity": scores["popularity"]}
    new_item = fit_new_item(rankers[chosen].tower, din_net, inputs[chosen]["train"], seed=cfg.seed)
    return TrainResult(
        rankers[chosen], rankers["base"], split, inputs[chosen]["test"], table, version_scores,
        metrics, retrieval, new_item,
    )  # fmt: skip


def select_din(cfg: TrainConfig, logs: dict[str, Any]) -> str:
    """The DIN variant that becomes the version: the better on validation GAUC (ties: the one
    with features), unless the config asks for one."""
    if cfg.select == "sequence" or "din_sequence" not in logs:
        return "din_sequence" if "din_sequence" in logs else "din"
    if cfg.select == "features":
        return "din"
    return max(("din", "din_sequence"), key=lambda n: (logs[n]["best_valid_gauc"], n == "din"))


def goals(
    test: dict[str, dict[str, float]],
    chosen: str,
    by_encoding: dict[str, float],
    time_split: dict[str, Any] | None = None,
) -> dict[str, bool]:
    """The offline goals of a run (docs/model.md)."""
    out = {
        "din_beats_base": test[chosen]["auc"] > test["base"]["auc"]
        and test[chosen]["gauc"] > test["base"]["gauc"],
        "base_beats_popularity": test["base"]["auc"] > test["popularity"]["auc"]
        and test["base"]["gauc"] > test["popularity"]["gauc"],
        "int8_within_0.002_auc_of_fp32": abs(by_encoding["int8"] - by_encoding["fp32"]) <= 0.002,
    }
    if "din_sequence" in test:
        tests = [test, *([time_split["test"]] if time_split and "test" in time_split else [])]
        out["features_add_0.005_gauc_on_a_protocol"] = any(
            t["din"]["gauc"] >= t["din_sequence"]["gauc"] + 0.005 for t in tests
        )
    return out
