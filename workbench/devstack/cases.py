"""An artifact's test users, shared by ``streamrank replay`` and ``streamrank bench rollout``:
loading them, their offline scores as a worker serving the published table answers, their
histories as ClickEvents (user and event ids prefixed per run), and waiting until a features
worker has applied them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import orjson
from tqdm import tqdm

from schemas import ClickEvent
from streamrank.errors import StreamrankError
from streamrank.kafka import clients as kafka
from streamrank.settings import Settings

if TYPE_CHECKING:
    from scoring.model.din import DenseWeights

# MovieLens-100K clicks are from 1997-98. The features worker dead-letters clicks further than
# max_event_skew_s from now (a guard against broken producer clocks); a historical replay must
# keep the original ts so the (ts, event_id) order is exactly the offline one, so the replay's
# own features worker accepts any ts within ~100 years.
HISTORICAL_SKEW_S = 100 * 365 * 24 * 3600
# The replay checks scores, not latency: a burst of queued requests must not expire on a busy
# host and come back degraded with neutral scores.
REPLAY_BUDGET_MS = 120_000


def private_run(run: str) -> dict[str, Any]:
    """Settings of a replay's own topics, consumer groups and workers, named after the run so it
    never mixes with other traffic on a shared stack; historical click times accepted; a
    generous request budget (scores, not latency, are checked)."""
    return {
        "STREAMRANK_TOPIC_CLICKS": f"{run}-clicks",
        "STREAMRANK_TOPIC_REQUESTS": f"{run}-rank-requests",
        "STREAMRANK_TOPIC_RESULTS": f"{run}-rank-results",
        "STREAMRANK_TOPIC_DEAD_LETTERS": f"{run}-dead-letters",
        "STREAMRANK_FEATURES_APP_ID": f"{run}-features",
        "STREAMRANK_SCORING_GROUP_ID": f"{run}-scoring",
        "STREAMRANK_MAX_EVENT_SKEW_S": HISTORICAL_SKEW_S,
        "STREAMRANK_SCORING_BUDGET_MS": REPLAY_BUDGET_MS,
        "STREAMRANK_METRICS_PORT": 0,
    }


@dataclass(frozen=True, slots=True)
class Case:
    """One test user of the artifact: history events (oldest first), candidates, labels."""

    user_id: str
    items: tuple[str, ...]
    labels: tuple[int, ...]
    history: tuple[dict[str, Any], ...]  # event_id, item_id, category, ts (epoch ms)
    file_scores: tuple[float, ...]  # offline DIN scores written by train (fp32 item table)
    ts: int | None = None  # the sample time (epoch ms): the request's as-of time
    features: dict[str, Any] | None = None  # raw side feature values the model saw offline
    attributes: dict[str, str] | None = None  # the user's attributes
    categories: tuple[str, ...] = ()  # the candidates' categories
    positive: str | None = None  # the held-out item (a cascade case: items = the offline reply)


def load_cases(path: Path, *, limit: int | None = None) -> list[Case]:
    """The test users of ``test_candidates.jsonl`` (the first ``limit`` of them)."""
    if not path.is_file():
        raise StreamrankError(
            f"{path} is missing: the replay needs an artifact written by `streamrank train`"
        )
    cases: list[Case] = []
    with path.open("rb") as fh:
        for line in fh:
            if limit is not None and len(cases) >= limit:
                break
            row = orjson.loads(line)
            cases.append(
                Case(
                    user_id=str(row["user_id"]),
                    items=tuple(row["items"]),
                    labels=tuple(int(x) for x in row["labels"]),
                    history=tuple(row["history"]),
                    file_scores=tuple(row["scores"]["din"]),
                    ts=row.get("ts"),
                    features=row.get("features"),
                    attributes=row.get("attributes"),
                    categories=tuple(row.get("categories", ())),
                )
            )
    if not cases:
        raise StreamrankError(f"{path} holds no test users")
    widths = {len(c.items) for c in cases}
    if len(widths) != 1:
        raise StreamrankError(f"{path}: users have different candidate counts {sorted(widths)}")
    return cases


def offline_scores(
    artifact: Any,
    cases: Sequence[Case],
    *,
    encoding: str,
    max_history: int,
    dense: DenseWeights = "fp32",
    batch_users: int = 64,
) -> npt.NDArray[np.float32]:
    """``[U, C]`` scores of the artifact's scorer (dense weights served as ``dense``) with its
    item table (and OOV row) put through ``encoding`` and back: what a worker serving the
    published rows with the same dense option should answer."""
    from scoring.embeddings.codec import roundtrip
    from scoring.serving.assemble import assemble, gather

    table = roundtrip(artifact.item_table, encoding)  # [rows, d]
    oov = roundtrip(artifact.oov_row[None, :], encoding)[0]  # [d]
    table = np.vstack([table, oov[None, :]])  # the last row answers unknown ids
    row_of = {item: i for i, item in enumerate(artifact.item_ids)}
    unknown = len(artifact.item_ids)
    scorer = artifact.scorer(dense=dense)
    out = np.zeros((len(cases), len(cases[0].items)), dtype=np.float32)
    for start in range(0, len(cases), batch_users):
        chunk = cases[start : start + batch_users]
        batch = assemble(
            [[e["item_id"] for e in c.history] for c in chunk],
            [list(c.items) for c in chunk],
            max_history=max_history,
        )
        index = np.fromiter(
            (row_of.get(i, unknown) for i in batch.unique_ids), np.int64, len(batch.unique_ids)
        )
        hist, cands = gather(table[index], batch)  # [b, L, d], [b, C, d]
        out[start : start + len(chunk)] = scorer.score(
            hist, batch.hist_mask, cands, batch.cand_mask, case_side(scorer.features, chunk)
        )
    return out


def case_side(spec: Any, cases: Sequence[Case]) -> Any:
    """The side inputs of test users from the raw values the training code computed."""
    from scoring.serving.features import ServedFeatures, side_arrays

    served = [
        ServedFeatures(
            c.ts or 0, (c.features or {}).get("codes"), (c.features or {}).get("counters")
        )
        for c in cases
    ]
    return side_arrays(spec, served, width=max(len(c.items) for c in cases))


def quality(labels: npt.ArrayLike, scores: npt.ArrayLike) -> dict[str, float]:
    from scoring.training.evaluation import auc, gauc

    return {"auc": round(auc(labels, scores), 6), "gauc": round(gauc(labels, scores), 6)}


def click_events(cases: Sequence[Case], *, run: str) -> list[ClickEvent]:
    """The histories as ClickEvents with the original ts; user and event ids prefixed with the
    run id (one shared prefix keeps the string order of event ids, hence the sequence order)."""
    return [
        ClickEvent(
            event_id=f"{run}-{e['event_id']}",
            user_id=f"{run}-{c.user_id}",
            item_id=e["item_id"],
            category=e.get("category") or None,
            ts=int(e["ts"]),
        )
        for c in cases
        for e in c.history
    ]


def expected_sequences(cases: Sequence[Case], *, run: str, length: int) -> dict[str, list[str]]:
    """Per (prefixed) user: the event ids Redis must hold once every click is applied."""
    out = {}
    for c in cases:
        ordered = sorted(c.history, key=lambda e: (int(e["ts"]), str(e["event_id"])))
        out[f"{run}-{c.user_id}"] = [f"{run}-{e['event_id']}" for e in ordered[-length:]]
    return out


async def produce_clicks(
    settings: Settings, events: Sequence[ClickEvent], *, progress: bool
) -> None:
    """Produce ``events`` to the clicks topic (keyed by user), acknowledged."""
    producer = kafka.producer(settings.kafka, acks="all", linger_ms=5)
    await producer.start()
    try:
        with tqdm(total=len(events), desc="produce clicks", unit="ev", disable=not progress) as bar:
            for start in range(0, len(events), 1000):
                chunk = events[start : start + 1000]
                futures = [
                    await producer.send(settings.topics.clicks, e.to_json(), key=e.user_id.encode())
                    for e in chunk
                ]
                await asyncio.gather(*futures)
                bar.update(len(chunk))
    finally:
        await producer.stop()


async def wait_applied(
    redis: Any,
    settings: Settings,
    expected: dict[str, list[str]],
    *,
    timeout_s: float,
    progress: bool,
    log_path: Path | None,
) -> None:
    """Poll the sequences (one round trip per poll) until every user holds exactly its events."""
    from streams.reader import FeatureReader

    reader = FeatureReader(redis=redis, features=settings.features)
    deadline = time.monotonic() + timeout_s
    done = 0
    with tqdm(
        total=len(expected), desc="features applied", unit="user", disable=not progress
    ) as bar:
        while True:
            sequences = await reader.get_sequences(expected)
            missing = [
                u for u, ids in expected.items() if [e.event_id for e in sequences[u]] != ids
            ]
            bar.update(len(expected) - len(missing) - done)
            done = len(expected) - len(missing)
            if not missing:
                return
            if time.monotonic() > deadline:
                user = missing[0]
                raise StreamrankError(
                    f"after {timeout_s:.0f}s, {len(missing)} of {len(expected)} users' sequences "
                    f"in Redis still differ from their replayed events (e.g. {user}: "
                    f"{len(sequences[user])} of {len(expected[user])} events); see the features "
                    f"worker log {log_path} and the dead-letter topic {settings.topics.dead_letters}"
                )
            await asyncio.sleep(0.25)


def newest_artifact(root: Path) -> Path:
    """The most recently written artifact under ``root`` that has test candidates."""
    from scoring.model.artifact import CANDIDATES_FILE, CONFIG_FILE

    found = [
        p for p in Path(root).glob(f"*/{CANDIDATES_FILE}") if (p.parent / CONFIG_FILE).is_file()
    ]
    if not found:
        raise StreamrankError(
            f"no artifact with {CANDIDATES_FILE} under {root}; train one with "
            "`streamrank train --out DIR` and pass --artifact DIR/<version>"
        )
    return max(found, key=lambda p: p.stat().st_mtime).parent
