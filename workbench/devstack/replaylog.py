"""The whole click log of a replay whose version reads counters: every window of every test
sample must hold in Redis what it held offline, so the replay produces the log the version was
trained on, not just the test users' histories.

The log keeps its original times (point-in-time features are then computed at the test
samples' own times), so its counter buckets are years old: the replay's features worker runs
with a counter lateness that reaches the oldest event, and the replay deletes the item counter
keys its events touch before it produces them (a crashed earlier replay cannot add to them) and
after it has ranked (they would otherwise live for as long as that lateness). User keys carry
the run's prefix and are deleted with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from schemas import ClickEvent
from streamrank import clock, keys
from streamrank.redis.client import unlink_matching
from streamrank.redis.pipeline import NodePipeline
from streamrank.settings import FeatureSettings
from streams.windows import bucket_start, windows_from_settings
from workbench.devstack.cases import Case


@dataclass(frozen=True)
class ReplayLog:
    """The log as the run's clicks, and what each test user's sequence holds once applied."""

    events: list[ClickEvent]
    sequences: dict[str, list[str]]  # prefixed test user -> event ids, (ts, event_id) order
    cap: int  # events per stored sequence: the history plus what comes at or after its time
    oldest_ms: int

    def settings_env(self, *, margin_s: int = 2 * 86400) -> dict[str, Any]:
        """The replay workers' settings: sequences long enough, every bucket reachable."""
        lateness = (clock.now_ms() - self.oldest_ms) // 1000 + margin_s
        return {"STREAMRANK_SEQUENCE_LENGTH": self.cap, "STREAMRANK_COUNTER_LATENESS_S": lateness}


def read_events(path: Path) -> list[ClickEvent]:
    """The events of ``replay_events.jsonl`` as written (ids not prefixed), in file order."""
    events: list[ClickEvent] = []
    with path.open("rb") as fh:
        for line in fh:
            event_id, user, item, category, ts = orjson.loads(line)
            events.append(ClickEvent(event_id, str(user), item, int(ts), category or None))
    return events


def load_log(path: Path, cases: Sequence[Case], *, run: str, max_history: int) -> ReplayLog:
    """Read ``replay_events.jsonl``; user and event ids prefixed with the run."""
    events = [
        ClickEvent(f"{run}-{e.event_id}", f"{run}-{e.user_id}", e.item_id, e.ts, e.category)
        for e in read_events(path)
    ]
    as_of = {f"{run}-{c.user_id}": int(c.ts or 0) for c in cases}
    per_user: dict[str, list[ClickEvent]] = {u: [] for u in as_of}
    for event in events:
        if event.user_id in per_user:
            per_user[event.user_id].append(event)
    cap = max_history
    for user, mine in per_user.items():
        mine.sort(key=lambda e: (e.ts, e.event_id))
        cap = max(cap, max_history + sum(1 for e in mine if e.ts >= as_of[user]))
    sequences = {u: [e.event_id for e in mine[-cap:]] for u, mine in per_user.items()}
    oldest = min((e.ts for e in events), default=clock.now_ms())
    return ReplayLog(events, sequences, cap, oldest)


def item_keys(events: Sequence[ClickEvent], features: FeatureSettings) -> list[str]:
    """The item-shard keys (counter buckets and dedupe markers) the events write."""
    found: set[str] = set()
    windows = windows_from_settings(features)
    for event in events:
        shard = keys.item_shard(event.item_id)
        found.add(keys.item_seen(shard, event.event_id))
        for window in windows:
            res = window.resolution_s
            found.add(keys.item_counter_bucket(shard, res, bucket_start(event.ts, res)))
    return sorted(found)


async def delete_keys(redis: Any, names: Sequence[str], *, chunk: int = 2000) -> int:
    """UNLINK ``names`` (one pipeline per node and chunk); returns how many existed."""
    deleted = 0
    for start in range(0, len(names), chunk):
        pipe = NodePipeline(redis)
        for name in names[start : start + chunk]:
            pipe.add(name, "UNLINK", name)
        deleted += sum(int(n) for n in await pipe.execute())
    return deleted


async def delete_user_keys(redis: Any, run: str) -> int:
    """Every key of the run's (prefixed) users."""
    return int(await unlink_matching(redis, keys.user_keys_pattern(f"{run}-*")))


async def load_attributes(
    redis: Any, cases: Sequence[Case], *, run: str, categories: Mapping[str, str] | None = None
) -> None:
    """The test users' attributes (prefixed ids), their candidates' categories and
    ``categories`` (item -> category: every item a retrieval request may rank)."""
    from streams.attributes import write_attributes

    users = {c.user_id: c.attributes for c in cases if c.attributes}
    items = {item: {"category": category} for item, category in (categories or {}).items()}
    items.update(
        (item, {"category": category})
        for c in cases
        for item, category in zip(c.items, c.categories, strict=False)
        if category
    )
    await write_attributes(redis, users=users, items=items, user_prefix=f"{run}-")
