"""Training and offline evaluation of DIN, BaseModel and Popularity (CPU, deterministic).

One pipeline for MovieLens and the synthetic data: :func:`train_and_evaluate` fits BaseModel and
DIN on the same samples (same seed, same embeddings architecture), picks each model's best epoch
by validation GAUC, and scores the test candidates. DIN's test scores come from the SERVING path
(materialised item table -> :class:`~scoring.model.din.DinScorer`), the same code the scoring worker
runs, and again after the item table goes through each store encoding (``auc_by_encoding``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn
from tqdm import tqdm

from scoring.embeddings.codec import ENCODINGS, roundtrip
from scoring.model.din import DIN, DinScorer, ItemTower, ModelSpec, build_net
from scoring.training.data import Dataset, Profiles, Samples, Split, build_profiles, build_samples
from scoring.training.evaluation import auc, gauc
from scoring.training.timesplit import TimeSplit, build_time_split

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
    profile: bool = False  # feed the user profile (age bucket, gender, occupation) to the head
    patience: int | None = None  # stop after this many epochs without a better validation GAUC
    time_split: bool = True  # also fit and report the time-split protocol
    spec: ModelSpec = field(default_factory=ModelSpec)

    def to_json(self) -> dict[str, Any]:
        return {
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "seed": self.seed,
            "history_len": self.history_len,
            "n_negatives": self.n_negatives,
            "threads": self.threads,
            "profile": self.profile,
            "patience": self.patience,
            "time_split": self.time_split,
        }


def seed_everything(seed: int, threads: int) -> None:
    """Deterministic CPU training: fixed seeds, deterministic kernels, fixed thread count."""
    torch.manual_seed(seed)
    np.random.seed(seed)  # nothing here uses it, but third-party code might
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)


class Ranker(nn.Module):
    """Item tower + dense net, on item indices (training and offline evaluation)."""

    def __init__(self, tower: ItemTower, net: nn.Module, profiles: Profiles | None = None) -> None:
        super().__init__()
        self.tower = tower
        self.net = net
        self.profiles = profiles  # set iff the net takes profile codes

    def forward(
        self, hist_idx: Tensor, hist_mask: Tensor, cand_idx: Tensor, profile: Tensor | None = None
    ) -> Tensor:
        """``hist_idx [B, L]``, ``hist_mask [B, L]`` bool, ``cand_idx [B]`` -> logits ``[B]``."""
        result: Tensor = self.net(self.tower(hist_idx), hist_mask, self.tower(cand_idx), profile)
        return result

    def profile_codes(self, users: npt.NDArray[np.str_]) -> Tensor | None:
        """``[n, P]`` profile codes of these users, or None for a profile-free model."""
        return None if self.profiles is None else torch.from_numpy(self.profiles.lookup(users))


def make_ranker(ds: Dataset, spec: ModelSpec, profiles: Profiles | None = None) -> Ranker:
    tower = ItemTower(
        n_items=len(ds.items),
        item_genres=torch.from_numpy(ds.item_genres),
        genre_mask=torch.from_numpy(ds.genre_mask),
        n_genres=len(ds.genres),
        id_dim=spec.id_dim,
        category_dim=spec.category_dim,
    )
    return Ranker(tower, build_net(spec), profiles)


def _trimmed(samples: Samples, idx: npt.NDArray[np.int64]) -> tuple[Tensor, Tensor]:
    """History of the chosen rows cut to the longest real history among them (left-aligned)."""
    mask = samples.hist_mask[idx]  # [B, L]
    width = max(int(mask.sum(1).max()), 1)
    return torch.from_numpy(samples.hist[idx, :width]), torch.from_numpy(mask[:, :width])


@torch.no_grad()
def eval_logits(
    ranker: Ranker, samples: Samples, batch_users: int = 256
) -> npt.NDArray[np.float32]:
    """Straightforward-forward logits ``[U, C]`` of evaluation samples."""
    ranker.eval()
    n_users, n_cands = samples.cand.shape
    out = np.zeros((n_users, n_cands), dtype=np.float32)
    for s in range(0, n_users, batch_users):
        idx = np.arange(s, min(s + batch_users, n_users))
        hist, mask = _trimmed(samples, idx)  # [b, L]
        cand = torch.from_numpy(samples.cand[idx])  # [b, C]
        prof = ranker.profile_codes(samples.user[idx])  # [b, P] or None
        logits = ranker(
            hist.repeat_interleave(n_cands, 0),
            mask.repeat_interleave(n_cands, 0),
            cand.reshape(-1),
            None if prof is None else prof.repeat_interleave(n_cands, 0),
        )  # [b*C]
        out[idx] = logits.view(len(idx), n_cands).numpy()
    return out


def serving_scores(
    scorer: DinScorer,
    table: npt.NDArray[np.float32],
    samples: Samples,
    batch_users: int = 64,
    profiles: Profiles | None = None,
) -> npt.NDArray[np.float32]:
    """Probabilities ``[U, C]`` through the serving scorer, item vectors taken from ``table``."""
    n_users, n_cands = samples.cand.shape
    out = np.zeros((n_users, n_cands), dtype=np.float32)
    for s in range(0, n_users, batch_users):
        idx = np.arange(s, min(s + batch_users, n_users))
        hist_idx, mask = _trimmed(samples, idx)
        hist = table[hist_idx.numpy()]  # [b, L, d]
        cands = table[samples.cand[idx]]  # [b, C, d]
        prof = None if profiles is None else profiles.lookup(samples.user[idx])  # [b, P]
        out[idx] = scorer.score(
            hist, mask.numpy(), cands, np.ones(cands.shape[:2], dtype=bool), profile=prof
        )
    return out


def fit(
    ranker: Ranker, split: Split, cfg: TrainConfig, *, name: str, bar: tqdm | None = None
) -> dict[str, Any]:
    """Train with Adam on BCE; keep the epoch with the best validation GAUC. Returns the log."""
    generator = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(ranker.parameters(), lr=cfg.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    train = split.train
    labels = torch.from_numpy(train.label)
    best: tuple[float, int, dict[str, Tensor]] | None = None
    log: list[dict[str, float]] = []
    for epoch in range(cfg.epochs):
        ranker.train()
        order = torch.randperm(len(train), generator=generator).numpy()
        total = 0.0
        for s in range(0, len(order), cfg.batch_size):
            idx = order[s : s + cfg.batch_size]
            hist, mask = _trimmed(train, idx)
            prof = ranker.profile_codes(train.user[idx])  # [B, P] or None
            logits = ranker(hist, mask, torch.from_numpy(train.cand[idx]), prof)  # [B]
            loss = loss_fn(logits, labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            if bar is not None:
                bar.update(1)
        valid = eval_logits(ranker, split.valid)
        entry = {
            "epoch": epoch + 1,
            "train_loss": round(total / len(order), 5),
            "valid_auc": round(auc(split.valid.label, valid), 5),
            "valid_gauc": round(gauc(split.valid.label, valid), 5),
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
    return {"best_epoch": best[1], "epochs": log}


@dataclass
class TrainResult:
    """Everything the CLI needs to write the artifact and the report."""

    din: Ranker
    base: Ranker
    split: Split
    item_table: npt.NDArray[np.float32]  # [n_items, d] DIN's materialised item vectors
    test_scores: dict[str, npt.NDArray[np.float32]]  # model -> [U, C]
    metrics: dict[str, Any]


def _metric_pair(labels: npt.NDArray[np.float32], scores: npt.NDArray[Any]) -> dict[str, float]:
    return {"auc": round(auc(labels, scores), 5), "gauc": round(gauc(labels, scores), 5)}


def train_and_evaluate(ds: Dataset, cfg: TrainConfig, *, progress: bool = True) -> TrainResult:
    """Build samples, fit BaseModel and DIN, evaluate all three models on the test candidates.

    The process-wide torch settings it changes (deterministic kernels, threads) are restored.
    """
    deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    try:
        return _train_and_evaluate(ds, cfg, progress=progress)
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)


@dataclass
class ProtocolRun:
    """BaseModel and DIN fitted on one protocol's train split, and their test scores."""

    rankers: dict[str, Ranker]  # "base", "din"
    logs: dict[str, Any]  # model -> fit log
    scorer: DinScorer  # DIN's serving scorer
    table: npt.NDArray[np.float32]  # [n_items, d] DIN's materialised item vectors
    scores: dict[str, npt.NDArray[np.float32]]  # model -> test scores [U, C]
    metrics: dict[str, Any]  # test AUC/GAUC per model, best epochs, sample counts, seconds


def evaluate_protocol(
    ds: Dataset,
    split: Split,
    cfg: TrainConfig,
    *,
    profiles: Profiles | None = None,
    bar: tqdm | None = None,
) -> ProtocolRun:
    """Fit BaseModel and DIN on ``split.train`` (same seed), score the test candidates.

    Popularity = the split's train counts; DIN is scored through the serving path.
    """
    started = time.perf_counter()
    logs: dict[str, Any] = {}
    rankers: dict[str, Ranker] = {}
    sizes = [len(v) for v in profiles.vocab.values()] if profiles else []
    for kind in ("base", "din"):
        torch.manual_seed(cfg.seed)  # same initial embeddings for both models
        spec = ModelSpec.from_json({**cfg.spec.to_json(), "kind": kind, "profile_sizes": sizes})
        rankers[kind] = make_ranker(ds, spec, profiles)
        logs[kind] = fit(rankers[kind], split, cfg, name=kind, bar=bar)
    train_s = time.perf_counter() - started
    test = split.test
    din_net = rankers["din"].net
    assert isinstance(din_net, DIN)
    scorer = DinScorer(din_net)
    table = rankers["din"].tower.export()  # [n_items, d]
    scores = {
        "popularity": split.train_item_counts[test.cand].astype(np.float32),
        "base": eval_logits(rankers["base"], test),
        "din": serving_scores(scorer, table, test, profiles=profiles),
    }
    metrics: dict[str, Any] = {
        "test": {name: _metric_pair(test.label, s) for name, s in scores.items()},
        "best_epoch": {name: log["best_epoch"] for name, log in logs.items()},
        "samples": {
            "train": len(split.train),
            "valid_users": len(split.valid),
            "test_users": len(test),
            "candidates_per_user": int(test.cand.shape[1]),
        },
        "train_seconds": round(train_s, 1),
    }
    return ProtocolRun(rankers, logs, scorer, table, scores, metrics)


def _time_split(
    ds: Dataset, cfg: TrainConfig, bar: tqdm, profiles: Profiles | None
) -> dict[str, Any]:
    """The time-split protocol's metrics, or why it could not run on this data."""
    split: TimeSplit = build_time_split(
        ds, history_len=cfg.history_len, n_negatives=cfg.n_negatives, seed=cfg.seed
    )
    found = {"cutoff_ms": split.cutoff_ms, "counts": split.counts}
    if min(len(split.train), len(split.valid), len(split.test)) == 0:
        return {**found, "not_run": "a split is empty: too few users active across the cutoff"}
    started = time.perf_counter()
    metrics = evaluate_protocol(ds, split, cfg, profiles=profiles, bar=bar).metrics
    return {**found, **metrics, "seconds": round(time.perf_counter() - started, 1)}


def _train_and_evaluate(ds: Dataset, cfg: TrainConfig, *, progress: bool) -> TrainResult:
    started = time.perf_counter()
    seed_everything(cfg.seed, cfg.threads)
    split = build_samples(
        ds, history_len=cfg.history_len, n_negatives=cfg.n_negatives, seed=cfg.seed
    )
    if len(split.train) == 0 or len(split.test) == 0:
        raise ValueError("not enough data: every user needs at least 4 events")
    protocols = 2 if cfg.time_split else 1
    batches = -(-len(split.train) // cfg.batch_size) * cfg.epochs * 2 * protocols
    profiles = build_profiles(ds) if cfg.profile else None
    with tqdm(total=batches, desc="train base+din", unit="batch", disable=not progress) as bar:
        run = evaluate_protocol(ds, split, cfg, profiles=profiles, bar=bar)
        other_started = time.perf_counter()
        time_split = _time_split(ds, cfg, bar, profiles) if cfg.time_split else None
        other_s = time.perf_counter() - other_started
    train_s = run.metrics["train_seconds"]
    scores, test, table, scorer = run.scores, split.test, run.table, run.scorer
    forward_probs = 1.0 / (1.0 + np.exp(-eval_logits(run.rankers["din"], test).astype(np.float64)))
    by_encoding = {}
    for enc in ENCODINGS:
        enc_scores = serving_scores(scorer, roundtrip(table, enc), test, profiles=profiles)
        by_encoding[enc] = round(auc(test.label, enc_scores), 5)
    metrics: dict[str, Any] = {
        "test": run.metrics["test"],
        "auc_by_encoding": by_encoding,
        "serving_vs_forward_max_abs_diff": float(np.abs(scores["din"] - forward_probs).max()),
        "training": run.logs,
        "samples": run.metrics["samples"],
        "time_split": time_split,
        "train_seconds": train_s,
        "eval_seconds": round(time.perf_counter() - started - train_s - other_s, 1),
    }
    t = metrics["test"]
    metrics["goals"] = {
        "din_beats_base": t["din"]["auc"] > t["base"]["auc"]
        and t["din"]["gauc"] > t["base"]["gauc"],
        "base_beats_popularity": t["base"]["auc"] > t["popularity"]["auc"]
        and t["base"]["gauc"] > t["popularity"]["gauc"],
        "int8_within_0.002_auc_of_fp32": abs(by_encoding["int8"] - by_encoding["fp32"]) <= 0.002,
    }
    return TrainResult(run.rankers["din"], run.rankers["base"], split, table, scores, metrics)


def feature_spec(ds: Dataset, cfg: TrainConfig) -> dict[str, Any]:
    """What config.json records about the inputs (how serving must build them)."""
    spec = cfg.spec
    return {
        "item": {
            "table": "item",
            "key": "raw item id string",
            "vector": [
                f"item_id embedding [{spec.id_dim}]",
                f"mean of the item's category embeddings [{spec.category_dim}]",
            ],
            "oov": "mean of all item vectors",
        },
        "category": {
            "source": "genres" if ds.name != "synthetic" else "planted cluster",
            "combine": "mean",
            "vocabulary": list(ds.genres),
        },
        "history": {
            "max_len": cfg.history_len,
            "order": "(ts, event_id) ascending, oldest first",
            "event_id": "zero-padded row position in the interaction file",
        },
        "candidate": "one item vector per candidate; C candidates share one history",
        "profile": build_profiles(ds).to_json() if cfg.profile else None,
        "context": None,
    }


def write_test_candidates(path: Any, ds: Dataset, result: TrainResult) -> int:
    """One JSON line per test user: candidates, labels, the history used, offline scores."""
    import orjson

    test = result.split.test
    probs: dict[str, npt.NDArray[Any]] = {
        "din": result.test_scores["din"],
        "base": 1.0 / (1.0 + np.exp(-result.test_scores["base"].astype(np.float64))),
        "popularity": result.test_scores["popularity"],
    }
    items = ds.items
    with open(path, "wb") as fh:
        for u in range(len(test)):
            rows = test.hist_rows[u][test.hist_mask[u]].tolist()
            history = [
                {
                    "event_id": f"{r:08d}",
                    "item_id": items[ds.item_index[r]],
                    "category": ds.item_category(int(ds.item_index[r])),
                    "ts": int(ds.ts[r]) * 1000,
                }
                for r in rows
            ]
            line = {
                "user_id": str(test.user[u]),
                "items": [items[i] for i in test.cand[u].tolist()],
                "labels": test.label[u].astype(int).tolist(),
                "history": history,
                "scores": {k: [round(float(x), 7) for x in v[u]] for k, v in probs.items()},
            }
            if result.din.profiles is not None:  # the raw profile and the codes the model saw
                line["profile"] = ds.users.get(str(test.user[u]), {})
                line["profile_codes"] = result.din.profiles.lookup(test.user[u : u + 1])[0].tolist()
            fh.write(orjson.dumps(line) + b"\n")
    return len(test)


def export_artifact(
    result: TrainResult, ds: Dataset, cfg: TrainConfig, out_dir: Any, *, encoding: str
) -> Any:
    """Write the versioned DIN artifact (weights, item table, config.json, test candidates)."""
    from scoring.model.artifact import CANDIDATES_FILE, save_artifact
    from scoring.model.din import dense_state

    tower = result.din.tower
    table = result.item_table
    path = save_artifact(
        out_dir,
        spec=result.din.net.spec,  # type: ignore[arg-type]
        dense_state=dense_state(result.din.net, tower.categories.weight),
        item_ids=list(ds.items),
        item_table=table,
        oov_row=table.mean(axis=0),
        encoding=encoding,
        feature_spec=feature_spec(ds, cfg),
        data={
            "name": ds.name,
            "sha256": ds.sha256,
            "events": ds.n_events,
            "users": len(np.unique(ds.user_ids)),
            "items": len(ds.items),
        },
        metrics={k: result.metrics[k] for k in ("test", "auc_by_encoding", "goals")},
        train=cfg.to_json(),
    )
    write_test_candidates(path / CANDIDATES_FILE, ds, result)
    return path
