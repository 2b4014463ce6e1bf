"""Both write contracts against a real Redis (and, in the cluster pass, a Redis Cluster): the
same state from the same events, a replayed batch changes nothing, and a producer's duplicate
(the same event id again in a later batch) is counted once on the user and the item side."""

from __future__ import annotations

import random
import time
from typing import Any

import orjson
import pytest

from schemas import ClickEvent
from streams.reader import FeatureReader
from tests.integration.support.features import counted_at, writer_for

pytestmark = pytest.mark.cluster

CONTRACTS = ["id_sets", "markers"]


def events_of(tag: str, now: int, n: int = 120, seed: int = 3) -> list[ClickEvent]:
    rng = random.Random(seed)
    return [
        ClickEvent(f"{tag}-{i:03d}", f"{tag}-u{rng.randrange(9)}", f"{tag}-i{rng.randrange(25)}",
                   now - rng.randrange(80_000), f"c{rng.randrange(3)}")
        for i in range(n)
    ]  # fmt: skip


async def state(reader: FeatureReader, settings: Any, tag: str, now: int) -> object:
    """Sequences and 1 h / 24 h counters of the tag's users and items, the tag stripped."""
    users, items = [f"{tag}-u{u}" for u in range(9)], [f"{tag}-i{i}" for i in range(25)]
    seqs = {u: [e.to_dict() for e in s] for u, s in (await reader.get_sequences(users)).items()}
    got = [seqs]
    for window in ("1h", "24h"):
        at = counted_at(settings, now, window)
        got.append(await reader.get_counters(user_ids=users, item_ids=items, at_ms=at))
    return orjson.loads(orjson.dumps(got).decode().replace(tag, "T"))


@pytest.mark.parametrize("contract", CONTRACTS)
async def test_a_replay_changes_nothing_and_a_duplicate_counts_once(
    make_settings, redis, unique, contract
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(STREAMRANK_FEATURES_WRITE_CONTRACT=contract)
    write = writer_for(settings, redis)
    reader = FeatureReader(redis=redis, features=settings.features)
    now = int(time.time() * 1000)
    tag = f"r{contract[0]}{unique}"
    events = events_of(tag, now)
    assert await write(events[:80], now) == 80
    before = await state(reader, settings, tag, now)
    assert await write(events[:80], now) == 0  # the whole batch redelivered
    assert await state(reader, settings, tag, now) == before
    # A later batch: 30 of the events again (a producer's retry), 40 new ones.
    assert await write(events[50:], now) == 40
    after: Any = await state(reader, settings, tag, now)
    day = after[2]
    assert sum(c["clicks_24h"] for c in day["users"].values()) == 120
    assert sum(c["clicks_24h"] for c in day["items"].values()) == 120
    assert sum(len(s) for s in after[0].values()) == 120


async def test_both_contracts_write_the_same_state(make_settings, redis, unique) -> None:  # type: ignore[no-untyped-def]
    now = int(time.time() * 1000)
    states = []
    for contract in CONTRACTS:
        settings = make_settings(STREAMRANK_FEATURES_WRITE_CONTRACT=contract)
        write = writer_for(settings, redis)
        tag = f"s{contract[0]}{unique}"
        events = events_of(tag, now, seed=11)
        assert await write(events[:70], now) + await write(events[40:], now) == 120
        reader = FeatureReader(redis=redis, features=settings.features)
        states.append(await state(reader, settings, tag, now))
    assert states[0] == states[1]
