"""Learning a version's "new item" id vector, after its training, with everything else frozen.

The vector replaces the id part of an item unknown to the version's table (the category part
is the mean of its categories' embeddings: :mod:`scoring.model.coldstart`). It is fitted on a
seeded sample of the training samples with each candidate's id embedding replaced by it and
its category part kept, so it stands for "some item of these categories" as the model sees
one. Only that vector is optimised, from the mean id embedding, with its own random generator:
the trained model, its figures and every other random draw are untouched, and the same seed
gives the same vector.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from scoring.model.din import ItemTower
from scoring.model.side import SideInputs
from scoring.training.data import Samples

logger = logging.getLogger(__name__)

SAMPLES = 16_384  # training samples the vector is fitted on (a seeded draw)
EPOCHS = 2
BATCH = 512
LR = 1e-2


class TrainingSamples(Protocol):
    """What the fit needs of a split's training part (``scoring.training.train.Inputs``)."""

    @property
    def samples(self) -> Samples: ...

    def batch(self, idx: Any, *, repeat: int = 1) -> tuple[Tensor, ...]: ...

    def side_inputs(self, idx: Any, *, repeat: int = 1) -> SideInputs: ...


def fit_new_item(
    tower: ItemTower,
    net: nn.Module,
    train: TrainingSamples,
    *,
    seed: int,
    samples: int = SAMPLES,
    epochs: int = EPOCHS,
) -> npt.NDArray[np.float32]:
    """The new-item id vector ``[id_dim]`` (float32) of a trained item tower and net (see the
    module doc); their weights are not changed."""
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    ranker = nn.ModuleList([tower, net])
    id_dim = tower.ids.embedding_dim
    frozen = [(p, p.requires_grad) for p in ranker.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    new_item = nn.Parameter(tower.ids.weight.detach().mean(0).clone())  # [id_dim]
    opt = torch.optim.Adam([new_item], lr=LR)
    loss_fn = nn.BCEWithLogitsLoss()
    n = len(train.samples)
    pool = torch.randperm(n, generator=generator)[: min(samples, n)].numpy()
    labels = torch.from_numpy(train.samples.label)
    ranker.eval()
    try:
        for _epoch in range(epochs):
            order = pool[torch.randperm(len(pool), generator=generator).numpy()]
            for s in range(0, len(order), BATCH):
                idx = order[s : s + BATCH]
                hist_idx, mask = train.batch(idx)
                cand = tower(torch.from_numpy(train.samples.cand[idx]))  # [b, d]
                cand = torch.cat([new_item.expand(len(idx), id_dim), cand[:, id_dim:]], dim=-1)
                logits = net(tower(hist_idx), mask, cand, train.side_inputs(idx))  # [b]
                loss = loss_fn(logits, labels[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    finally:
        for p, wanted in frozen:
            p.requires_grad_(wanted)
    logger.info("new-item vector fitted in %.1fs", time.perf_counter() - started)
    return new_item.detach().numpy().astype(np.float32)
