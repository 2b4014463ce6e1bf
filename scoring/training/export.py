"""Writing a trained version: the artifact (weights, item table, config.json with the feature
spec) and the replay file of its test samples with the feature values the model saw."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from scoring.training.data import Dataset, Samples, time_order
from scoring.training.train import TrainConfig, TrainResult

# The whole log as clicks, in (ts, event_id) order: what a replay of a version with counters
# produces, so that every window of every test sample holds what it held offline.
EVENTS_FILE = "replay_events.jsonl"


def feature_spec(ds: Dataset, cfg: TrainConfig, result: TrainResult) -> dict[str, Any]:
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
            "order": "(ts, event_id) ascending, oldest first; only events before the request time",
            "event_id": "zero-padded row position in the interaction file",
        },
        "candidate": "one item vector per candidate; C candidates share one history",
        "inputs": result.din.features.to_json(),
    }


def history_events(ds: Dataset, test: Samples, u: int) -> list[dict[str, Any]]:
    """Test user ``u``'s history as click events, oldest first (``ts`` in epoch ms)."""
    return [
        {
            "event_id": f"{r:08d}",
            "item_id": ds.items[ds.item_index[r]],
            "category": ds.item_category(int(ds.item_index[r])),
            "ts": int(ds.ts[r]) * 1000,
        }
        for r in test.hist_rows[u][test.hist_mask[u]].tolist()
    ]


def write_cascade(path: Path, ds: Dataset, result: TrainResult) -> int:
    """One JSON line per test user: the request time, the history, and the offline cascade's
    reply (items best first, their DIN probabilities) and held-out item (docs/model.md)."""
    assert result.retrieval is not None
    test, cascade = result.split.test, result.retrieval.cascade
    with open(path, "wb") as fh:
        for u in range(len(test)):
            line = {
                "user_id": str(test.user[u]),
                "ts": int(test.ts[u]),
                "history": history_events(ds, test, u),
                "attributes": ds.users.get(str(test.user[u]), {}),
                "items": cascade.items[u],
                "scores": [round(x, 7) for x in cascade.scores[u]],
                "positive": ds.items[int(test.cand[u, 0])],
            }
            fh.write(orjson.dumps(line) + b"\n")
    return len(test)


def write_test_candidates(path: Any, ds: Dataset, result: TrainResult) -> int:
    """One JSON line per test user: the sample time, candidates, labels, the history used, the
    raw feature values the version's model saw, offline scores."""
    test = result.split.test
    raw = result.test_inputs.raw
    probs: dict[str, npt.NDArray[Any]] = {
        "din": result.test_scores["din"],
        "base": 1.0 / (1.0 + np.exp(-result.test_scores["base"].astype(np.float64))),
        "popularity": result.test_scores["popularity"],
    }
    items = ds.items
    with open(path, "wb") as fh:
        for u in range(len(test)):
            line: dict[str, Any] = {
                "user_id": str(test.user[u]),
                "ts": int(test.ts[u]),
                "items": [items[i] for i in test.cand[u].tolist()],
                "labels": test.label[u].astype(int).tolist(),
                "history": history_events(ds, test, u),
                "features": {k: v[u].tolist() for k, v in raw.items()},
                "attributes": ds.users.get(str(test.user[u]), {}),
                "categories": [ds.item_category(i) for i in test.cand[u].tolist()],
                "scores": {k: [round(float(x), 7) for x in v[u]] for k, v in probs.items()},
            }
            fh.write(orjson.dumps(line) + b"\n")
    return len(test)


def export_artifact(
    result: TrainResult, ds: Dataset, cfg: TrainConfig, out_dir: Any, *, encoding: str
) -> Path:
    """Write the versioned DIN artifact (weights, item table, config.json, test candidates)."""
    import torch

    from scoring.model.artifact import CANDIDATES_FILE, CASCADE_FILE, save_artifact
    from scoring.model.coldstart import NEW_ITEM_TABLE
    from scoring.model.din import dense_state

    tower = result.din.tower
    table = result.item_table
    state = dense_state(result.din.net, tower.categories.weight)
    if result.new_item is not None:  # the cold-start id vector ships with the category table
        state[NEW_ITEM_TABLE] = torch.from_numpy(np.ascontiguousarray(result.new_item))
    path: Path = save_artifact(
        out_dir,
        spec=result.din.net.spec,  # type: ignore[arg-type]
        dense_state=state,
        item_ids=list(ds.items),
        item_table=table,
        oov_row=table.mean(axis=0),
        encoding=encoding,
        feature_spec=feature_spec(ds, cfg, result),
        data={
            "name": ds.name,
            "sha256": ds.sha256,
            "events": ds.n_events,
            "users": len(np.unique(ds.user_ids)),
            "items": len(ds.items),
        },
        metrics={
            k: result.metrics[k]
            for k in ("test", "selected", "auc_by_encoding", "goals", "full_ranking")
            if k in result.metrics
        },
        train=cfg.to_json(),
        retrieval=result.retrieval.files if result.retrieval else None,
    )
    write_test_candidates(path / CANDIDATES_FILE, ds, result)
    if result.retrieval is not None:
        write_cascade(path / CASCADE_FILE, ds, result)
    if result.din.features.counters:
        write_events(path / EVENTS_FILE, ds)
    return path


def write_events(path: Path, ds: Dataset) -> int:
    """Every event of the log as ``[event_id, user_id, item_id, category, ts_ms]`` lines."""
    rows = time_order(ds)
    with open(path, "wb") as fh:
        for r in rows.tolist():
            item = int(ds.item_index[r])
            line = [f"{r:08d}", str(ds.user_ids[r]), ds.items[item], ds.item_category(item),
                    int(ds.ts[r]) * 1000]  # fmt: skip
            fh.write(orjson.dumps(line) + b"\n")
    return len(rows)
