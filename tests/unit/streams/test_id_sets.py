"""The ``id_sets`` contract's script calls (streams.id_sets): layout, summed effects, slot groups,
and, through a Python model of the script, that replays of partially applied batches and
producer duplicates at new offsets change nothing (the script itself: tests/integration)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import orjson
from redis.crc import key_slot

from schemas import ClickEvent, Limits
from streamrank import keys
from streamrank.redis.client import slot_of_tag
from streamrank.redis.pipeline import ScriptCall
from streams.classify import Record, classify
from streams.id_sets import ENTRY
from streams.windows import Window
from streams.writer import BatchCalls, assemble

NOW = 1_800_000_000_000
WINDOWS = (Window("1h", 3600, 300), Window("24h", 86400, 3600))
TTL_S = 10
FINE_START = NOW // 1000 // 300 * 300
COARSE_START = NOW // 1000 // 3600 * 3600


def build(events: list[ClickEvent], slot_of: Any = None, cap: int = 50) -> BatchCalls:
    return assemble(
        events, now_ms=NOW, windows=WINDOWS, lateness_s=600, sequence_length=cap,
        sequence_ttl_s=100, dedupe_ttl_s=TTL_S, slot_of=slot_of,
    )  # fmt: skip


class Model:
    """What the script does to Redis, in Python: id sets, capped zsets, counter hashes."""

    def __init__(self) -> None:
        self.sets: defaultdict[str, set[str]] = defaultdict(set)
        self.zsets: defaultdict[str, dict[str, int]] = defaultdict(dict)
        self.hashes: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def run(self, call: ScriptCall) -> int:
        d = orjson.loads(call.args[0])
        detail = orjson.loads(call.args[1])["e"]
        n_user, _n_item, n_users = d["n"]
        ks = list(call.keys)
        seen = [k for k, i in enumerate(d["m"]) if i in self.sets[ks[0]] | self.sets[ks[1]]]
        drop, minus, applied = set(), Counter[int](), n_user
        for k in seen:
            row = detail[ENTRY * k : ENTRY * (k + 1)]
            if row[0]:
                applied -= 1
                drop.add((row[0], row[1]))
            minus.update(slot for slot in row[2:] if slot)
        s, pos = d["s"], 0
        for u in range(1, n_users + 1):
            count, pairs = s[pos], s[pos + 1 : pos + 1 + 2 * s[pos]]
            pos += 1 + 2 * count
            zset = self.zsets[ks[1 + u]]
            zset.update({pairs[2 * j + 1]: int(pairs[2 * j]) for j in range(count) if (u, j + 1) not in drop})  # fmt: skip
            for member in sorted(zset, key=lambda m: (zset[m], m))[: -d["h"][0]]:
                del zset[member]
        c = d["c"]
        for slot, j in enumerate(range(0, len(c), 3), start=1):
            bucket, name, value = c[j : j + 3]
            if value - minus[slot] > 0:
                self.hashes[ks[1 + n_users + abs(bucket)]][name] += value - minus[slot]
        self.sets[ks[0]].update(d["m"])
        return applied

    def state(self) -> tuple[object, object]:
        """Sequences and counters (the id sets left out: their keys depend on the grouping)."""
        zsets = {k: v for k, v in self.zsets.items() if v}
        return zsets, {k: dict(v) for k, v in self.hashes.items() if v}


def events_of(tag: str, n: int, users: int = 7, items: int = 11) -> list[ClickEvent]:
    return [
        ClickEvent(f"{tag}{i:03d}", f"u{i % users}", f"i{i % items}", NOW - 7 * i, f"c{i % 3}")
        for i in range(n)
    ]


def test_one_call_sums_effects_per_field_and_keeps_each_entry_s_detail() -> None:
    events = [
        ClickEvent("e1", "u1", "i1", NOW, "drama"),
        ClickEvent("e2", "u1", "i1", NOW + 1, "drama", "cart"),
        ClickEvent("e3", "u2", "i1", NOW + 2, None),
    ]
    batch = build(events)
    assert batch.contract == "id_sets" and batch.events == 3
    [call] = batch.calls
    d = orjson.loads(call.args[0])
    generation = NOW // (TTL_S * 1000)
    assert call.keys[:2] == [keys.event_ids(0, generation), keys.event_ids(0, generation - 1)]
    assert call.keys[2:4] == ["sr:{u:u1}:seq", "sr:{u:u2}:seq"]
    assert d["n"] == [3, 3, 2]
    assert d["h"] == [50, "100000", str((generation + 2) * TTL_S * 1000)]
    assert d["m"] == ["u1\x1fe1", "u1\x1fe2", "u2\x1fe3"]
    assert d["s"] == [2, str(NOW), "e1\x1fi1\x1fdrama\x1fclick", str(NOW + 1),
                      "e2\x1fi1\x1fdrama\x1fcart", 1, str(NOW + 2), "e3\x1fi1\x1f\x1fclick"]  # fmt: skip
    buckets = call.keys[4:]
    triples = [d["c"][j : j + 3] for j in range(0, len(d["c"]), 3)]
    sums = {(buckets[abs(b) - 1], f): v for b, f, v in triples}
    shard = keys.item_shard("i1")
    assert sums == {
        (f"sr:{{u:u1}}:cnt:300:{FINE_START}", "n"): 2,
        (f"sr:{{u:u1}}:cnt:3600:{COARSE_START}", "n"): 2,
        (f"sr:{{u:u1}}:cnt:3600:{COARSE_START}", "c:drama"): 2,
        (f"sr:{{i:{shard}}}:cnt:300:{FINE_START}", "i1"): 3,
        (f"sr:{{i:{shard}}}:cnt:3600:{COARSE_START}", "i1"): 3,
        (f"sr:{{u:u2}}:cnt:300:{FINE_START}", "n"): 1,
        (f"sr:{{u:u2}}:cnt:3600:{COARSE_START}", "n"): 1,
    }
    # A bucket's first field in the call is flagged (negative index): only then may the call
    # have created the key, so only then does it set the bucket's expiry.
    assert [b < 0 for b, _f, _v in triples] == [True, True, False, True, True, True, True]
    assert len(d["x"]) == len(buckets) == len(set(buckets))
    detail = orjson.loads(call.args[1])["e"]
    rows = [detail[k : k + ENTRY] for k in range(0, len(detail), ENTRY)]
    assert rows[0] == [1, 1, 1, 2, 3, 4, 5]  # user 1's first member; every slot it adds to
    assert rows[1] == [1, 2, 1, 2, 3, 4, 5]
    assert rows[2] == [2, 1, 6, 7, 0, 4, 5]  # no category: no category slot


def test_on_a_cluster_each_call_is_one_slot_and_every_event_has_one_id_per_group() -> None:
    events = events_of("e", 400, users=37, items=53)
    batch = build(events, slot_of=slot_of_tag)
    ids: Counter[str] = Counter()
    for call in batch.calls:
        assert len({key_slot(k.encode()) for k in call.keys}) == 1, call.keys
        d = orjson.loads(call.args[0])
        assert len(d["m"]) == len(set(d["m"])) and len(d["m"]) * ENTRY == len(orjson.loads(call.args[1])["e"])  # fmt: skip
        ids.update(d["m"])
    for e in events:  # once in its user's group, and again when its item shard is elsewhere
        apart = slot_of_tag(keys.user_tag(e.user_id)) != slot_of_tag(keys.item_tag(keys.item_shard(e.item_id)))  # fmt: skip
        assert ids[f"{e.user_id}\x1f{e.event_id}"] == 1 + apart
    tags = {keys.user_tag(e.user_id) for e in events} | {keys.item_tag(keys.item_shard(e.item_id)) for e in events}  # fmt: skip
    assert len(batch.calls) == len({slot_of_tag(t) for t in tags})
    assert sum(orjson.loads(c.args[0])["n"][0] for c in batch.calls) == 400


def test_a_replay_of_a_partially_applied_batch_applies_only_the_rest() -> None:
    events = events_of("p", 150)
    clean = Model()
    assert clean.run(build(events).calls[0]) == 150
    split = build(events, slot_of=slot_of_tag).calls
    model = Model()
    users = [c for c in split if orjson.loads(c.args[0])["n"][0]]
    part = users[::2] + [c for c in split if c not in users][1::2]
    first = sum(model.run(c) for c in part)  # a batch that failed after some of its calls
    assert 0 < first < 150
    assert first + sum(model.run(c) for c in split) == 150  # the retry applies only the rest
    assert sum(model.run(c) for c in split) == 0
    assert model.state() == clean.state()


def test_producer_duplicates_at_new_offsets_from_several_partitions_count_once() -> None:
    """Records of two partitions in one batch; a producer sent some events again (new offsets,
    other partition, later batch): applied once, counted once, whatever the grouping."""
    events = events_of("d", 60)

    def record(partition: int, offset: int, e: ClickEvent) -> Record:
        value = orjson.dumps({"event_id": e.event_id, "user_id": e.user_id, "item_id": e.item_id, "ts": e.ts, "category": e.category})  # fmt: skip
        return Record("clicks", partition, offset, e.user_id.encode(), value)

    first = [record(i % 2, 100 + i, e) for i, e in enumerate(events[:40])]
    again = [record((i + 1) % 2, 500 + i, e) for i, e in enumerate(events[30:])]  # 10 repeats
    for slot_of in (None, slot_of_tag):
        model = Model()
        applied = 0
        for records in (first, again):
            out = classify(records, limits=Limits(), now_ms=NOW, max_skew_s=86400)
            applied += sum(model.run(c) for c in build(out.apply, slot_of=slot_of).calls)
        assert applied == 60
        clean = Model()
        clean.run(build(events).calls[0])
        assert model.state() == clean.state()


def test_two_users_sharing_an_event_id_are_both_applied() -> None:
    events = [ClickEvent("same", "u1", "i1", NOW, None), ClickEvent("same", "u2", "i1", NOW, None)]
    model = Model()
    assert model.run(build(events).calls[0]) == 2
    assert model.run(build(events[:1]).calls[0]) == 0
    counts = model.state()[1]
    shard = keys.item_shard("i1")
    assert counts[f"sr:{{i:{shard}}}:cnt:300:{FINE_START}"] == {"i1": 2}
