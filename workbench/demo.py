"""``streamrank demo`` (``make demo``): the whole pipeline on the embedded stack, until Ctrl-C.

1. the stack: the embedded broker and Redis (unless they already answer), and the topics;
2. a model: the newest artifact trained on the same data, else a quick training run
   (MovieLens-100K when ``data_dir`` or ``data_cache_dir`` holds ``ml-100k``, else synthetic
   clicks); published + activated;
3. a features worker and a scoring worker as child processes (logs under ``run_dir/demo``);
4. clicks produced continuously (the dataset's events in time order, ts = now) and rank
   requests for many users (the dataset's users: half with 20 candidates each, half without,
   so the engine retrieves them through the cascade); every few seconds either
   the live dashboard of ``streamrank top`` (``--view top``, the default) or how one user's
   sequence fills up, a RankRequest for that user with the reply's top items, model
   version, degraded flag and timings, and the cascade's top items for them (``--view user``).

Ctrl-C (SIGINT) or SIGTERM stops the workers, then the stack if the demo started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from schemas import ClickEvent, RankRequest
from streamrank import clock
from streamrank.errors import RedisUnavailable
from streamrank.kafka import clients as kafka
from streamrank.redis.client import redis_client
from streamrank.settings import Settings

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

    from scoring.training.train import TrainConfig
    from workbench.devstack.processes import WorkerProcess

logger = logging.getLogger(__name__)

# The synthetic model when there is no MovieLens: trained until validation GAUC stops improving
# (like `streamrank train --synthetic --users 300 --items 100000 --epochs 10 --patience 2`),
# well under a minute on 2 cores.
SYNTHETIC_USERS, SYNTHETIC_ITEMS, SYNTHETIC_SEED = 300, 100_000, 17
SYNTHETIC_EPOCHS, PATIENCE = 10, 2
# One epoch on ml-100k, a third of a full train: the demo shows the pipeline, and the
# artifact is kept, so the next demo starts at once (and a
# fully trained artifact from `streamrank train` is reused when there is one).
DEMO_EPOCHS = 3  # MovieLens: at most, stopped when validation GAUC stalls
CANDIDATES = 20  # per rank request: items the watched user clicks later + random others
WORKERS = ("features", "scoring")
Watched = tuple[str, list[str], set[str]]  # (user, candidates, the candidates it clicks later)


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


@dataclass(frozen=True)
class DemoModel:
    """The artifact the demo serves and the dataset its clicks come from."""

    path: Path
    dataset: Any  # scoring.training.data.Dataset
    trained_now: bool


def _matching_artifact(root: Path, sha256: str) -> Path | None:
    """The newest artifact under ``root`` trained on the data with this hash."""
    found = []
    for config in Path(root).glob("*/config.json"):
        try:
            meta = json.loads(config.read_text())
        except (OSError, ValueError):
            continue
        if (
            meta.get("data", {}).get("sha256") == sha256
            and meta.get("model", {}).get("kind") == "din"
        ):
            found.append(config)
    return max(found, key=lambda p: p.stat().st_mtime).parent if found else None


def demo_train_config(settings: Settings, epochs: int) -> TrainConfig:
    """The demo's training: early stopping, leave-last-out only (the served model's protocol)."""
    from scoring.training.train import TrainConfig

    return TrainConfig(
        epochs=epochs,
        patience=PATIENCE,
        history_len=settings.features.sequence_length,
        threads=settings.scoring.torch_threads,
        time_split=False,
        sequence_baseline=False,  # the served model and Base: the comparison the demo shows
        bucket_s=(settings.features.counter_bucket_s, settings.features.counter_coarse_bucket_s),
    )


def prepare_model(settings: Settings, *, synthetic: bool, progress: bool = True) -> DemoModel:
    """Reuse the newest artifact trained on the demo's data, or train one (with a bar)."""
    from scoring.training.data import load_movielens
    from scoring.training.export import export_artifact
    from scoring.training.synthetic import generate
    from scoring.training.train import train_and_evaluate
    from workbench.datasets import MOVIELENS_100K, dataset_roots, find_dataset

    movielens = find_dataset(settings.tools, MOVIELENS_100K)
    if not synthetic and movielens is not None:
        ds = load_movielens(movielens)
        epochs = DEMO_EPOCHS
        say(f"data: MovieLens-100K from {movielens} ({ds.n_events} ratings replayed as clicks)")
    else:
        ds = generate(n_users=SYNTHETIC_USERS, n_items=SYNTHETIC_ITEMS, seed=SYNTHETIC_SEED)
        epochs = SYNTHETIC_EPOCHS
        where = " or ".join(
            str(root / MOVIELENS_100K.name) for root in dataset_roots(settings.tools)
        )
        why = (
            "--synthetic"
            if synthetic
            else (f"no MovieLens in {where}; `streamrank data fetch movielens` downloads it")
        )
        say(f"data: synthetic clicks ({why}; {ds.n_events} events, {SYNTHETIC_USERS} users)")
    root = Path(settings.tools.artifacts_dir)
    found = _matching_artifact(root, ds.sha256)
    if found is not None:
        say(f"model: reusing artifact {found} (newest trained on this data)")
        return DemoModel(found, ds, trained_now=False)
    say(f"model: training DIN on {ds.name}, up to {epochs} epoch(s) (until validation stops "
        f"improving); {'about a minute' if ds.name == 'synthetic' else 'about three minutes'} on 2 cores ...")  # fmt: skip
    cfg = demo_train_config(settings, epochs)

    result = train_and_evaluate(ds, cfg, progress=progress)
    path = Path(export_artifact(result, ds, cfg, root, encoding=settings.embeddings.encoding))
    test = result.metrics["test"]
    say(
        f"model: {path.name} written to {path}; test AUC / GAUC: "
        + ", ".join(f"{name} {test[name]['auc']:.4f} / {test[name]['gauc']:.4f}"
                    for name in (result.metrics["selected"], "base", "popularity"))
    )  # fmt: skip
    return DemoModel(path, ds, trained_now=True)


def dataset_clicks(ds: Any, *, run: str, now_ms: Any = None) -> Iterator[ClickEvent]:
    """The dataset's events in time order, forever (each pass gets new event ids), ts = now."""
    from scoring.training.data import time_order

    rows = time_order(ds)
    tick = now_ms or clock.now_ms
    for lap in range(1_000_000):
        for r in rows.tolist():
            item = int(ds.item_index[r])
            yield ClickEvent(
                event_id=f"{run}-{lap}-{r:08d}",
                user_id=str(ds.user_ids[r]),
                item_id=ds.items[item],
                category=ds.item_category(item) or None,
                ts=tick(),
            )


def pick_user_and_items(
    ds: Any, *, horizon: int, max_events: int, seed: int = 0
) -> tuple[str, list[str], set[str]]:
    """A user active in the first ``horizon`` events, and candidates: items that user clicks later in the
    stream plus random others (so a good model visibly ranks the later clicks high)."""
    from scoring.training.data import time_order

    rows = time_order(ds)
    early = ds.user_ids[rows[:horizon]]
    names, first, inverse, counts = np.unique(
        early, return_index=True, return_inverse=True, return_counts=True
    )
    last = np.zeros(len(names), dtype=np.int64)
    np.maximum.at(last, inverse, np.arange(len(early)))
    # Someone who clicks within the first seconds, whose clicks are spread over the window and do
    # not overflow the sequence at once (MovieLens users often rate hundreds of films in one
    # sitting): the sequence visibly fills soon after the clicks start.
    eligible = (counts >= 5) & (counts <= max_events) & (first < max(horizon // 10, 1))
    spread = np.where(eligible, last - first, -1)
    pick = int(np.argmax(spread)) if spread.max() > 0 else int(np.argmax(counts))
    user = str(names[pick])
    mine = rows[ds.user_ids[rows] == user]
    later = list(dict.fromkeys(ds.items[int(ds.item_index[r])] for r in mine[len(mine) // 2 :]))
    rng = np.random.default_rng(seed)
    positives = later[: CANDIDATES // 4]
    others = [
        ds.items[int(i)] for i in rng.permutation(len(ds.items)) if ds.items[int(i)] not in later
    ][: CANDIDATES - len(positives)]
    items = positives + others
    rng.shuffle(items)
    return user, items, set(positives)


def _metrics_port(settings: Settings, kind: str) -> int:
    """The worker kind's default /metrics port, or a free one when it is taken (0 = disabled
    by ``STREAMRANK_METRICS_PORT=0``)."""
    from streamrank.runtime.metrics_http import DEFAULT_PORTS
    from workbench.devstack.services import free_port, port_in_use

    if settings.observability.metrics_port == 0:
        return 0
    port = settings.observability.metrics_port or DEFAULT_PORTS[kind]
    return free_port() if port_in_use(port) else port


def rank_requests(ds: Any, *, seed: int = 1) -> Iterator[RankRequest]:
    """Rank requests for the dataset's users (uniformly): every other one with 20 random
    candidates, the rest without (the cascade retrieves the top 10)."""
    rng = np.random.default_rng(seed)
    users = np.unique(ds.user_ids)
    tag = uuid.uuid4().hex[:6]
    for n in range(1_000_000_000):
        user = str(users[int(rng.integers(len(users)))])
        if n % 2:
            yield RankRequest(request_id=f"demo-{tag}-{n}", user_id=user, top_k=10)
            continue
        picks = rng.choice(len(ds.items), size=min(CANDIDATES, len(ds.items)), replace=False)
        yield RankRequest(
            request_id=f"demo-{tag}-{n}",
            user_id=user,
            items=tuple(ds.items[int(i)] for i in picks),
        )


class Dashboard:
    """``streamrank top`` inside the demo: redrawn in place on a terminal, printed as a new
    table each refresh otherwise."""

    def __init__(self, ports: dict[str, int]) -> None:
        from rich.console import Console

        self._targets = [(k, f"http://127.0.0.1:{p}/metrics") for k, p in ports.items() if p]
        self._console = Console()
        self._live: Any = None
        self._before: list[Any] = []

    async def refresh(self) -> None:
        from rich.live import Live

        from workbench.top import figures, render, scrape_all

        now = await scrape_all(self._targets)
        view = render(figures(now, self._before), title="streamrank demo")
        self._before = now
        if not self._console.is_terminal:
            self._console.print(view)
        elif self._live is None:
            self._live = Live(view, console=self._console, auto_refresh=False)
            self._live.start()
        else:
            self._live.update(view, refresh=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()


async def _show_features(settings: Settings, redis: Any, user: str) -> None:
    """The watched user's sequence and counters; a Redis that does not answer in time (a
    loaded host) is said and tried again at the next refresh."""
    from streams.reader import read_user_features

    try:
        features = await read_user_features(settings, user, redis=redis)
    except RedisUnavailable as exc:
        print(f"features: user {user}: no read ({exc})", flush=True)
        return
    newest = [e["item_id"] for e in features["sequence"][-5:]]
    counters = features["counters"]
    print(
        f"features: user {user} has {len(features['sequence'])} events in its sequence "
        f"(newest {newest}); clicks 1h {counters['clicks_1h']}, 24h {counters['clicks_24h']}",
        flush=True,
    )


async def _show_rank(client: Any, user: str, items: list[str] | None, later: set[str]) -> None:
    """One ranking for ``user``: of ``items``, or (None) retrieved by the cascade."""
    from scoring.client import RankRejected, RankTimeout

    started = time.perf_counter()
    try:
        result = await client.rank(user, items, top_k=None if items else 5, timeout=10.0)
    except (RankTimeout, RankRejected) as exc:
        print(f"rank: user {user}: no ranking ({exc})", flush=True)
        return
    client_ms = (time.perf_counter() - started) * 1000
    stages = ", ".join(f"{k} {v:.1f}" for k, v in result.timings_ms.items() if k != "total")
    reason = f" ({result.reason})" if result.reason else ""
    what = f"top of {len(items)} candidates" if items else "the cascade's top 5 of the catalogue"
    print(
        f"rank: user {user} -> model {result.model_version or '-'}, "
        f"degraded={result.degraded}{reason}, cached={result.cached}, worker "
        f"{result.timings_ms.get('total', 0):.1f} ms ({stages}), round trip {client_ms:.1f} ms; "
        f"{what} (* = the user clicks it later in the stream):",
        flush=True,
    )
    ranked = sorted(zip(result.scores, result.items, strict=True), reverse=True)[:5]
    for pos, (score, item) in enumerate(ranked, 1):
        print(f"  {pos}. {score:.4f}  {item}{' *' if item in later else ''}", flush=True)


async def run_demo(
    settings: Settings,
    model: DemoModel,
    *,
    duration_s: float | None,
    rate: float,
    every_s: float,
    logs: Path,
    request_rate: float = 20.0,
    view: str = "top",
) -> None:
    """Publish + activate the model, start both workers, then produce, watch and rank."""
    from workbench.devstack.processes import start_worker

    await _serve(settings, model)
    ports = {kind: _metrics_port(settings, kind) for kind in WORKERS}
    handles = {
        kind: start_worker(kind, settings, log_path=logs / f"{kind}-worker.log",
                           metrics_port=ports[kind])
        for kind in WORKERS
    }  # fmt: skip
    producers: list[AIOKafkaProducer] = []
    try:
        await _wait_ready(handles, ports)
        watched = pick_user_and_items(
            model.dataset,
            horizon=max(1000, int(rate * 30)),
            max_events=settings.features.sequence_length,
        )
        if view == "top" and not all(ports.values()):
            say("the dashboard reads the workers' /metrics, which are off: showing --view user")
            view = "user"
        watching = "the dashboard" if view == "top" else f"user {watched[0]}"
        say(
            f"producing {rate:.0f} clicks/s and {request_rate:.0f} rank requests/s for "
            f"{len(np.unique(model.dataset.user_ids))} users; showing {watching}; press Ctrl-C "
            "to stop"
        )
        say(
            f"in another shell: streamrank tail {settings.topics.results} --follow | streamrank "
            "lag --watch | streamrank top | streamrank dlq"
        )
        # Clicks are batched (linger); requests go out at once, as a latency-sensitive client
        # sends them (what RankClient does): their queue wait is the broker's, not ours.
        producers = [kafka.producer(settings.kafka, acks="all", linger_ms=5),
                     kafka.producer(settings.kafka, acks="all", linger_ms=0)]  # fmt: skip
        for producer in producers:
            await producer.start()
        dashboard = Dashboard(ports) if view == "top" else None
        await _produce_and_watch(
            settings, model, producers, dashboard, watched, rate=rate,
            request_rate=request_rate, duration_s=duration_s, every_s=every_s,
        )  # fmt: skip
    finally:
        await _stop(producers, handles)


async def _serve(settings: Settings, model: DemoModel) -> None:
    """The topics made, and the model published (when it is not yet) and activated."""
    from scoring.model.artifact import load_artifact
    from scoring.model.registry import activate_version
    from streamrank.kafka.topics import create_topics
    from workbench.devstack.pipeline import ensure_published

    topics = await create_topics(settings)
    say("topics: " + ", ".join(f"{t} ({s})" for t, s in topics.items()))
    artifact = load_artifact(model.path)
    redis = redis_client(settings.redis)
    try:
        published = await ensure_published(redis, artifact)
        previous = await activate_version(redis, artifact.version, features=settings.features)
        loaded = await _load_attributes(redis, model.dataset)
    finally:
        await redis.aclose()
    say(f"attributes: {loaded['users']} users, {loaded['items']} items (streamrank features load)")
    say(
        f"model {artifact.version}: {'published' if published['published_now'] else 'already published'} "
        f"({published['encoding']} item table, {len(artifact.item_ids)} items); active "
        f"(was {previous or 'none'})"
    )


async def _load_attributes(redis: Any, ds: Any) -> dict[str, int]:
    """The dataset's user attributes and item categories into the attribute tables (what
    ``streamrank features load`` does from files): inputs of a version with side features."""
    from streams.attributes import write_attributes

    items = {ds.items[i]: {"category": ds.item_category(i)} for i in range(len(ds.items))}
    await write_attributes(redis, users=ds.users, items=items)
    return {"users": len(ds.users), "items": len(items)}


async def _wait_ready(handles: dict[str, WorkerProcess], ports: dict[str, int]) -> None:
    say("waiting for the features and scoring workers ...")
    await asyncio.gather(
        asyncio.to_thread(handles["features"].wait_ready, 180),
        asyncio.to_thread(handles["scoring"].wait_ready, 180),
    )  # fmt: skip
    for kind, handle in handles.items():
        metrics = f"http://127.0.0.1:{ports[kind]}/metrics" if ports[kind] else "off"
        say(f"{kind} worker pid {handle.pid} ready (log {handle.log_path}; metrics {metrics})")


async def _produce_and_watch(
    settings: Settings,
    model: DemoModel,
    producers: list[AIOKafkaProducer],
    dashboard: Dashboard | None,
    watched: Watched,
    *,
    rate: float,
    request_rate: float,
    duration_s: float | None,
    every_s: float,
) -> None:
    """Clicks and rank requests at their rates until ``duration_s`` (None: for ever); every
    ``every_s`` the dashboard, or the watched user's features and a ranking for them;
    ``producers``: the clicks' and the requests'."""
    from scoring.client import RankClient

    click_producer, request_producer = producers
    clicks = dataset_clicks(model.dataset, run=f"demo-{uuid.uuid4().hex[:6]}")
    requests = rank_requests(model.dataset)
    redis = redis_client(settings.redis)
    async with RankClient(settings=settings) as client, contextlib.aclosing(redis):
        started = time.monotonic()
        produced = asked = 0
        next_show = started + every_s
        try:
            while duration_s is None or time.monotonic() - started < duration_s:
                elapsed = time.monotonic() - started
                due = int(elapsed * rate) - produced
                produced += await _send_due(click_producer, settings.topics.clicks, clicks, due)
                due = int(elapsed * request_rate) - asked
                topic = settings.topics.requests
                asked += await _send_due(request_producer, topic, requests, due)
                if time.monotonic() >= next_show:
                    next_show += every_s
                    await click_producer.flush()
                    if dashboard is not None:
                        await dashboard.refresh()
                    else:
                        print(f"clicks: {produced} produced, {asked} rank requests", flush=True)
                        await _show_features(settings, redis, watched[0])
                        user, items, later = watched
                        await _show_rank(client, user, items, later)
                        await _show_rank(client, user, None, later)
                await asyncio.sleep(0.05)
        finally:
            if dashboard is not None:
                dashboard.close()


async def _send_due(
    producer: AIOKafkaProducer,
    topic: str,
    source: Iterator[ClickEvent | RankRequest],
    due: int,
) -> int:
    """The next ``due`` messages of ``source`` sent to ``topic``, keyed by user; how many."""
    for message in (next(source) for _ in range(max(0, due))):
        await producer.send(topic, message.to_json(), key=message.user_id.encode())
    return max(0, due)


async def _stop(producers: list[AIOKafkaProducer], handles: dict[str, WorkerProcess]) -> None:
    for producer in producers:
        with contextlib.suppress(Exception):  # stopping: a failed flush loses demo clicks only
            await producer.stop()
    codes = await asyncio.gather(*(asyncio.to_thread(h.stop) for h in reversed(handles.values())))
    say(
        "stopped the scoring and features workers (exit codes "
        + ", ".join(str(c) for c in codes)
        + ")"
    )
