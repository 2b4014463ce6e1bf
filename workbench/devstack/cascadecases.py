"""An artifact's cascade test users (``cascade_test.jsonl``) and the offline cascade's reply to
each with the item table as a worker serves it: :func:`scoring.training.fullrank.din_cascade`,
the code ``streamrank train`` evaluates, on the encoded table, its inputs rebuilt from the
artifact's files (the histories; the whole log for a version with counters)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from schemas import ClickEvent
from streamrank.errors import ArtifactError, StreamrankError
from workbench.devstack.cases import REPLAY_BUDGET_MS, Case

if TYPE_CHECKING:
    from scoring.model.din import DenseWeights
    from scoring.training.cascade_eval import CascadeConfig, CascadeResult
    from scoring.training.data import Dataset, Samples

# Stage budgets of the replay's worker: it checks results, not latency, so no stage may fall
# back on a busy host (their sum stays under the request's, REPLAY_BUDGET_MS).
REPLAY_STAGE_BUDGET_MS = {"RETRIEVAL": 20_000, "FILTER": 5_000, "COARSE": 5_000,
                          "RANK": 60_000, "RERANK": 5_000}  # fmt: skip


def load_cascade_cases(path: Path, *, limit: int | None = None) -> list[Case]:
    """The users of ``cascade_test.jsonl`` (the first ``limit``): ``items`` / ``file_scores``
    the offline cascade's reply, ``labels`` 1 where an item is the held-out ``positive``."""
    if not path.is_file():
        raise StreamrankError(
            f"{path} is missing: `streamrank replay --cascade` needs an artifact trained with "
            "the retrieval model (`streamrank train` without --no-retrieval)"
        )
    cases: list[Case] = []
    with path.open("rb") as fh:
        for line in fh:
            if limit is not None and len(cases) >= limit:
                break
            row = orjson.loads(line)
            items = tuple(str(i) for i in row["items"])
            positive = str(row["positive"])
            cases.append(
                Case(
                    user_id=str(row["user_id"]),
                    items=items,
                    labels=tuple(int(i == positive) for i in items),
                    history=tuple(row["history"]),
                    file_scores=tuple(float(s) for s in row["scores"]),
                    ts=int(row["ts"]),
                    attributes=row.get("attributes"),
                    positive=positive,
                )
            )
    if not cases:
        raise StreamrankError(f"{path} holds no test users")
    return cases


def cascade_config(artifact: Any) -> CascadeConfig:
    """The widths and rule the artifact's offline cascade ran with (config.json
    ``retrieval.train.cascade``)."""
    from scoring.training.cascade_eval import CascadeConfig

    raw = ((artifact.config.get("retrieval") or {}).get("train") or {}).get("cascade")
    if raw is None:
        raise ArtifactError(
            f"artifact {artifact.path}: config.json lacks retrieval.train.cascade (the offline "
            "cascade's widths and rule); train it again with `streamrank train`"
        )
    try:
        return CascadeConfig.from_json(raw)
    except ValueError as exc:
        raise ArtifactError(f"artifact {artifact.path}: retrieval.train.cascade: {exc}") from exc


def cascade_env(cfg: CascadeConfig) -> dict[str, Any]:
    """The replay worker's cascade settings: the offline cascade's widths and rule as the
    default scene's, no hot items merged (the pool is wall-clock state), no result cache, and
    budgets no stage falls back under."""
    return {
        "STREAMRANK_CASCADE_RETRIEVE": cfg.widths.retrieve,
        "STREAMRANK_CASCADE_COARSE": cfg.widths.coarse,
        "STREAMRANK_CASCADE_RERANK_WINDOW": cfg.widths.rerank,
        "STREAMRANK_CASCADE_TOP_K": cfg.top_k,
        "STREAMRANK_CASCADE_FILTER_SEEN": cfg.filter_seen,
        "STREAMRANK_CASCADE_CATEGORY_CAP": cfg.category_cap,
        "STREAMRANK_CASCADE_SCENES": {},
        "STREAMRANK_CASCADE_HOT_MERGE": 0,
        "STREAMRANK_CASCADE_RESULT_CACHE": "off",
        "STREAMRANK_CASCADE_BUDGET_MS": REPLAY_BUDGET_MS,
        **{f"STREAMRANK_CASCADE_BUDGET_{k}_MS": v for k, v in REPLAY_STAGE_BUDGET_MS.items()},
    }


def item_categories(item_ids: Sequence[str], events: Sequence[ClickEvent]) -> dict[str, str]:
    """Each known item's category as its events carry it (the first non-empty one)."""
    known = set(item_ids)
    out: dict[str, str] = {}
    for e in events:
        if e.category and e.item_id in known:
            out.setdefault(e.item_id, e.category)
    return out


def offline_inputs(
    artifact: Any, cases: Sequence[Case], events: Sequence[ClickEvent], *, max_history: int
) -> tuple[Dataset, Samples]:
    """The training code's view of the cases: a :class:`Dataset` of ``events`` (the log the
    counters count; ids not prefixed) over the artifact's item rows, and test ``Samples``
    (each history's newest ``max_history`` events, oldest first, as of the case's ``ts``)."""
    from scoring.training.data import Dataset, Samples

    items = tuple(artifact.item_ids)
    row_of = {item: r for r, item in enumerate(items)}
    unknown = sorted({e.item_id for e in events if e.item_id not in row_of})
    if unknown:
        raise ArtifactError(
            f"artifact {artifact.path}: {len(unknown)} logged items are not in item_ids.txt "
            f"(e.g. {unknown[:3]}): the log is not the one the version was trained on"
        )
    categories = item_categories(items, events)
    genres = tuple(sorted(set(categories.values())))
    code = {g: k for k, g in enumerate(genres)}
    item_genres = np.array([[code.get(categories.get(i, ""), 0)] for i in items], np.int64)
    genre_mask = np.array([[i in categories] for i in items], dtype=bool)  # [N, 1]
    ds = Dataset(
        name="replay",
        user_ids=np.array([e.user_id for e in events], dtype=np.str_),
        item_index=np.array([row_of[e.item_id] for e in events], dtype=np.int64),
        ts=np.array([e.ts // 1000 for e in events], dtype=np.int64),
        items=items,
        genres=genres,
        item_genres=item_genres.reshape(len(items), 1),
        genre_mask=genre_mask,
        sha256="",
        users={c.user_id: dict(c.attributes) for c in cases if c.attributes},
    )
    n = len(cases)
    hist = np.zeros((n, max(1, max_history)), dtype=np.int64)  # [U, L]
    for u, c in enumerate(cases):
        rows = [row_of.get(e["item_id"], -1) for e in c.history][-max_history:]
        if min(rows, default=0) < 0:
            raise ArtifactError(f"user {c.user_id}: a history item is not in item_ids.txt")
        hist[u, : len(rows)] = rows
    lengths = np.array([min(len(c.history), max_history) for c in cases], dtype=np.int64)
    mask = np.arange(hist.shape[1])[None, :] < lengths[:, None]  # [U, L]
    test = Samples(
        user=np.array([c.user_id for c in cases], dtype=np.str_),
        hist=hist,
        hist_mask=mask,
        hist_rows=np.full(hist.shape, -1, dtype=np.int64),  # the export's only: not rebuilt
        cand=np.zeros((n, 1), dtype=np.int64),
        label=np.zeros((n, 1), dtype=np.float32),
        ts=np.array([int(c.ts or 0) for c in cases], dtype=np.int64),
    )
    return ds, test


def history_events(cases: Sequence[Case]) -> list[ClickEvent]:
    """The cases' histories as events (ids not prefixed): the log of a version without
    counters (only the item categories are read from it)."""
    return [
        ClickEvent(str(e["event_id"]), c.user_id, str(e["item_id"]), int(e["ts"]),
                   e.get("category") or None)
        for c in cases
        for e in c.history
    ]  # fmt: skip


def offline_cascade(
    artifact: Any,
    cases: Sequence[Case],
    events: Sequence[ClickEvent],
    cfg: CascadeConfig,
    *,
    encoding: str,
    max_history: int,
    dense: DenseWeights = "fp32",
    threads: int = 1,
    progress: bool = False,
) -> CascadeResult:
    """The offline cascade's reply per case, with the DIN item table put through ``encoding``
    and back (``"fp32"``: the table as trained, what ``cascade_test.jsonl`` records) and the
    dense weights served as ``dense``; ``events``: the log the counters count. Torch runs on
    ``threads`` threads meanwhile (the worker's setting: more only slow the small forwards)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _offline_cascade(artifact, cases, events, cfg, encoding=encoding,
                                max_history=max_history, dense=dense, progress=progress)  # fmt: skip
    finally:
        torch.set_num_threads(before)


def _offline_cascade(
    artifact: Any,
    cases: Sequence[Case],
    events: Sequence[ClickEvent],
    cfg: CascadeConfig,
    *,
    encoding: str,
    max_history: int,
    dense: DenseWeights,
    progress: bool,
) -> CascadeResult:
    from scoring.embeddings.codec import roundtrip
    from scoring.training.fullrank import DinModel, din_cascade, histories
    from scoring.training.pointintime import LogIndex
    from streams.windows import Window

    ds, test = offline_inputs(artifact, cases, events, max_history=max_history)
    retriever = artifact.retriever()
    scorer = artifact.scorer(dense=dense)
    spec = scorer.features
    spans = {"1h": 3600, "24h": 86400}
    windows = {name: Window(name, spans[name], int(res)) for name, res in spec.windows.items()}
    din = DinModel(
        scorer=scorer,
        table=roundtrip(artifact.item_table, encoding),
        features=spec,
        windows=windows,
        index=LogIndex.build(ds) if spec.counters else None,
    )
    users = retriever.user_vectors(histories(ds, test))  # [U, D]
    return din_cascade(ds, test, retriever, users, din, cfg, width=cfg.top_k, progress=progress)
