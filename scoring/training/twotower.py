"""Training the two-tower retrieval model (:mod:`scoring.model.retrieval`) on the DIN's samples.

The positives of the DIN's train samples (history before the sample time -> the clicked item)
train both towers with an in-batch softmax: every other positive of the batch is a negative,
logits are ``u·v / temperature`` minus ``log q(item)`` (the logQ correction: popular items are
in-batch negatives more often, which would otherwise push them down), and a batch's repeats of
the positive item are masked out of its negatives. Samples with an empty history are left out
(their vector at serving is the popularity direction). Deterministic given the seed (CPU).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.nn import functional as F
from tqdm import tqdm

from scoring.model.ann import IndexOptions
from scoring.model.retrieval import (
    RetrievalFiles,
    RetrievalSpec,
    Retriever,
    TwoTower,
    retrieval_files,
)
from scoring.training.cascade_eval import CascadeConfig
from scoring.training.data import Dataset, Samples

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetrievalConfig:
    """Hyper-parameters of the two-tower model, its index and the offline cascade."""

    spec: RetrievalSpec = field(default_factory=RetrievalSpec)
    epochs: int = 10
    batch_size: int = 1024
    lr: float = 5e-3
    temperature: float = 0.1
    logq: bool = True
    index: IndexOptions = field(default_factory=IndexOptions)
    cascade: CascadeConfig = field(default_factory=CascadeConfig)  # the offline cascade

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.spec.to_json(),
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "lr": self.lr,
            "temperature": self.temperature,
            "logq": self.logq,
            "index": self.index.to_json(),
            "cascade": self.cascade.to_json(),
        }


def primary_categories(ds: Dataset) -> npt.NDArray[np.int64]:
    """Each item's first listed category as a code into ``ds.genres`` (-1: none, or the
    ``unknown`` genre)."""
    first = np.where(ds.genre_mask[:, 0], ds.item_genres[:, 0], -1).astype(np.int64)  # [N]
    if "unknown" in ds.genres:
        first[first == ds.genres.index("unknown")] = -1
    return first


def positives(samples: Samples) -> npt.NDArray[np.int64]:
    """Rows of the train samples that are positives with at least one history event."""
    return np.flatnonzero((samples.label > 0.5) & samples.hist_mask.any(axis=1)).astype(np.int64)


def fit_two_tower(
    ds: Dataset, train: Samples, cfg: RetrievalConfig, *, seed: int, progress: bool = False
) -> tuple[TwoTower, dict[str, Any]]:
    """Train the towers on the positives of ``train``; returns the model and its log."""
    started = time.perf_counter()
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = TwoTower(
        cfg.spec,
        n_items=len(ds.items),
        item_genres=torch.from_numpy(ds.item_genres),
        genre_mask=torch.from_numpy(ds.genre_mask),
        n_genres=len(ds.genres),
    )
    rows = positives(train)
    if len(rows) == 0:
        raise ValueError("no positive train sample with a history: cannot train retrieval")
    cand = torch.from_numpy(train.cand[rows])  # [P]
    counts = torch.bincount(cand, minlength=len(ds.items)).double()  # [N]
    log_q = torch.log(counts / counts.sum()).float()  # [N], finite on the items that occur
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses: list[float] = []
    steps = -(-len(rows) // cfg.batch_size) * cfg.epochs
    with tqdm(total=steps, desc="retrieval", unit="batch", disable=not progress) as bar:
        for _ in range(cfg.epochs):
            order = rows[torch.randperm(len(rows), generator=generator).numpy()]
            total = 0.0
            for s in range(0, len(order), cfg.batch_size):
                loss = _step(model, train, order[s : s + cfg.batch_size], log_q, cfg)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += float(loss.detach()) * min(cfg.batch_size, len(order) - s)
                bar.update(1)
            losses.append(round(total / len(order), 5))
    model.eval()
    log = {"train_loss": losses, "positives": len(rows),
           "train_seconds": round(time.perf_counter() - started, 2)}  # fmt: skip
    logger.info("retrieval: %s", log)
    return model, log


def _step(
    model: TwoTower,
    train: Samples,
    idx: npt.NDArray[np.int64],
    log_q: torch.Tensor,
    cfg: RetrievalConfig,
) -> torch.Tensor:
    """The in-batch softmax loss of one batch of positives."""
    mask_np = train.hist_mask[idx]  # [b, L]
    width = int(mask_np.sum(1).max())
    hist_idx = torch.from_numpy(train.hist[idx, :width])  # [b, L']
    cand = torch.from_numpy(train.cand[idx])  # [b]
    # the tower runs once per distinct item of the batch, not once per history slot
    uniq, inverse = torch.unique(torch.cat([hist_idx.reshape(-1), cand]), return_inverse=True)
    vecs = model.items(uniq)  # [I, D]
    hist = vecs[inverse[: hist_idx.numel()].view(hist_idx.shape)]  # [b, L', D]
    users = model.users(hist, torch.from_numpy(mask_np[:, :width]))  # [b, D]
    items = vecs[inverse[hist_idx.numel() :]]  # [b, D]
    logits = users @ items.T / cfg.temperature  # [b, b]: row = user, column = item
    if cfg.logq:
        logits = logits - log_q[cand].unsqueeze(0)  # [b, b]
    same = cand.unsqueeze(0) == cand.unsqueeze(1)  # [b, b]
    same.fill_diagonal_(False)  # the positive stays; its repeats are not negatives
    logits = logits.masked_fill(same, float("-inf"))  # [b, b]
    return F.cross_entropy(logits, torch.arange(len(idx)))


def train_retriever(
    ds: Dataset,
    train: Samples,
    item_counts: npt.NDArray[np.int64],
    cfg: RetrievalConfig,
    *,
    seed: int,
    progress: bool = False,
) -> tuple[Retriever, RetrievalFiles, dict[str, Any]]:
    """Train the towers, materialise them and build their index: the serving retriever, the
    artifact part and a report (training and index build)."""
    model, log = fit_two_tower(ds, train, cfg, seed=seed, progress=progress)
    files, retriever = retrieval_files(
        model,
        item_ids=ds.items,
        primary_category=primary_categories(ds),
        categories=ds.genres,
        item_counts=item_counts,
        options=cfg.index,
        train={**cfg.to_json(), "seed": seed, **log},
    )
    index = files.config["index"]
    report = {**log, "index": {k: index[k] for k in ("kind", "build_seconds", "bytes")},
              "memory_bytes": retriever.memory_bytes()}  # fmt: skip
    return retriever, files, report
