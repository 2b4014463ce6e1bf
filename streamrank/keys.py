"""The Redis key contract: every key streamrank reads or writes is built here, and only here.

One contract for standalone Redis, Sentinel and Redis Cluster. Every key carries a **hash tag**
(the part in ``{...}``): Redis Cluster places a key by the CRC16 of its tag alone, so keys with
one tag always share a hash slot, and every multi-key operation of streamrank (a Lua script, an
``MGET``) touches keys of one tag only. On standalone Redis the braces are plain characters.

Every key builder below has one row (``tests/unit/core/test_keys_table.py`` checks it): the key,
its type, what it holds, how long it lives, who writes it and who reads it.

====================  ======  ======================================================================
builder               type    key, contents, lifetime, writer and readers
====================  ======  ======================================================================
sequence              zset    ``sr:{u:<user>}:seq``: the user's latest events; score = event ts
                              (epoch ms), member = ``event_id \\x1f item_id \\x1f category \\x1f
                              action`` (:func:`sequence_member`; members written before the
                              action was kept have three fields). Equal scores sort by member
                              bytes, i.e. by event_id: the (ts, event_id) order the offline
                              training code uses.
                              Lifetime: capped at ``sequence_length``; TTL ``sequence_ttl_s``,
                              renewed on every write.
                              Writer: features workers (streams.writer). Readers: scoring workers
                              and ``streamrank features`` (streams.reader).
seen                  string  ``sr:{u:<user>}:seen:<event_id>``: "1" once the event's effects on its
                              user's keys are applied (dedupe for at-least-once replays); per user,
                              so the marker and the effects it gates share a slot.
                              Lifetime: TTL ``dedupe_ttl_s``.
                              Writer and reader: the features workers' batch script
                              (streams.writer, ``SET NX``).
user_counter_bucket   hash    ``sr:{u:<user>}:cnt:<res>:<start>``: one user's clicks in one time
                              bucket; ``res`` = bucket size in seconds (``counter_bucket_s`` for
                              the 1 h window, ``counter_coarse_bucket_s`` for 24 h), ``start`` =
                              bucket start (epoch s). Fields: ``n`` (clicks); coarse buckets also
                              ``c:<category>`` (:func:`category_field`).
                              Lifetime: PEXPIREAT bucket end + window + ``counter_lateness_s``.
                              Writer: features workers (streams.writer). Readers: scoring workers
                              and ``streamrank features`` (streams.reader).
item_counter_bucket   hash    ``sr:{i:<shard>}:cnt:<res>:<start>``: the clicks in one time bucket
                              of the items of one shard; field = item id, value = clicks.
                              ``shard`` = :func:`item_shard` (CRC-32 of the id modulo
                              :data:`ITEM_COUNTER_SHARDS`), so one bucket of every item is that
                              many keys in as many slots, not one hot key.
                              Lifetime: as the user counter buckets.
                              Writer: features workers (streams.writer). Readers: scoring workers
                              (streams.reader).
user_attributes       hash    ``sr:{u:<user>}:attr``: the user's offline attributes: field = attribute
                              name (``age``, ``gender``, ``occupation``, ...), value = its value as
                              text; in the user's slot, so it is read with the sequence.
                              Lifetime: no TTL; rewritten (HSET) by every load.
                              Writer: ``streamrank features load`` (streams.attributes). Readers:
                              scoring workers (streams.batch_read).
item_attributes       hash    ``sr:{i:<shard>}:attr``: the offline attributes of one shard's items
                              (``shard`` = :func:`item_shard`): field = item id, value = a JSON
                              object, e.g. ``{"category": "Action|Comedy"}``.
                              Lifetime: no TTL; rewritten (HSET) by every load.
                              Writer: ``streamrank features load`` (streams.attributes). Readers:
                              scoring workers (streams.batch_read).
item_seen             string  ``sr:{i:<shard>}:seen:<event_id>``: "1" once the event's item counts
                              are applied: the item shard's own dedupe marker (the user's marker
                              lives in another slot, and no script spans two).
                              Lifetime: PXAT the expiry of the event's last counter bucket.
                              Writer and reader: the features workers' batch script under
                              ``write_contract=markers`` (:func:`seen` too).
event_ids             set     ``sr:{s:<n>}:ids:<generation>``: the ``user_id \\x1f event_id`` of
                              every event whose effects in one slot group are applied (dedupe of
                              replays and producer duplicates, ``write_contract=id_sets``);
                              ``{s:<n>}`` = :func:`slot_tag` of the group's hash slot (slot 0 on a
                              single server), ``generation`` = now // ``dedupe_ttl_s`` (processing
                              time): a batch checks its generation and the one before and adds to
                              its own.
                              Lifetime: PEXPIREAT the end of the next generation, so an event id
                              is remembered between ``dedupe_ttl_s`` and twice that.
                              Writer and reader: the features workers' batch script
                              (streams.id_sets).
result_cache          string  ``sr:{u:<user>}:res:<version>:<variant>``: the latest final result of a
                              retrieval request (JSON: the sequence version it was computed
                              for, items, scores, served features); ``variant`` = a digest of
                              the scene, top_k and exclude (scoring.serving.result_cache). In
                              the user's slot.
                              Lifetime: PX TTL ``STREAMRANK_CASCADE_RESULT_CACHE_TTL_S``, set on
                              every write.
                              Writer and reader: scoring workers with ``result_cache=redis``.
embedding_meta        hash    ``sr:{emb:<version>:<table>}:meta``: table metadata: dim, encoding,
                              rows, buckets, shards, oov (the encoded OOV row), published_at,
                              publish_id. Written last: a table without it is not published.
                              Upserts add ``overlay_seq``, ``overlay_id`` and ``overlay_rows``.
                              Lifetime: until ``streamrank embeddings delete``.
                              Writer: ``streamrank publish`` (scoring.embeddings.publish).
                              Readers: scoring workers, ``streamrank embeddings info``.
embedding_publish_id  string  ``sr:{emb:<version>:<table>:<shard>}:pid``: the table's publish_id,
                              once per shard: the fetch script checks it in the slot it reads
                              (the meta is in another).
                              Lifetime: until ``streamrank embeddings delete``.
                              Writer: ``streamrank publish``. Reader: the scoring workers' fetch
                              script (scoring.embeddings.fetch).
embedding_bucket      hash    ``sr:{emb:<version>:<table>:<shard>}:<bucket>``: encoded rows: field
                              = raw id, value = encoded row bytes; ``bucket`` (decimal) =
                              scoring.embeddings.bucketing.bucket_of(id, buckets), ``shard`` =
                              bucket modulo the table's ``shards`` (:func:`embedding_shard`).
                              Buckets stay small enough for Redis' compact listpack encoding.
                              Lifetime: until ``streamrank embeddings delete``.
                              Writer: ``streamrank publish``. Reader: the scoring workers' fetch
                              script.
embedding_overlay     hash    ``sr:{emb:<version>:<table>:<shard>}:ov``: rows upserted after the
                              publish (``streamrank embeddings upsert``): field = raw id, value =
                              encoded row, in the shard of the id's base bucket, so the fetch
                              script reads overlay-then-base in one call; an overlay row wins.
                              Lifetime: until the version is deleted (a republish starts empty).
                              Writer: ``streamrank embeddings upsert`` (scoring.embeddings.overlay).
                              Reader: the scoring workers' fetch script.
embedding_overlay_id  string  ``sr:{emb:<version>:<table>:<shard>}:ovid``: the table's overlay id
                              (zero-padded upsert sequence), once per shard, set after the rows
                              and only ever raised: the fetch script replies the one it saw.
                              Lifetime: until the version is deleted.
                              Writer: ``streamrank embeddings upsert``. Reader: the fetch script.
embedding_versions    set     ``sr:{emb}:versions``: published embedding versions. Version and
                              table names match ``[A-Za-z0-9][A-Za-z0-9._-]*`` (no ``:``, braces or
                              glob characters), so the SCAN pattern ``sr:{emb:<version>:*``
                              matches exactly one version's keys.
                              Lifetime: a member until ``streamrank embeddings delete``.
                              Writer: ``streamrank publish``. Readers: ``streamrank embeddings
                              versions``, ``streamrank canary`` (checks a split's versions).
active_model          string  ``sr:{model}:active``: the serving model version.
                              Lifetime: no TTL; moved, never deleted.
                              Writers: ``streamrank activate`` (scoring.model.registry), rollout
                              transitions (scoring.rollout.state). Readers: scoring workers
                              (scoring.serving.watcher), the rollout driver and status.
model_split           string  ``sr:{model}:split``: optional canary split, e.g.
                              ``din-a:0.9,din-b:0.1``; same slot as the pointer (one MGET).
                              Lifetime: no TTL; deleted when the split is cleared.
                              Writers: ``streamrank canary`` (scoring.model.versions), rollout
                              transitions. Readers: scoring workers, the rollout driver and status.
model_dense           string  ``sr:{model:<version>}:dense``: the version's dense weights
                              (safetensors bytes), written after the item table.
                              Lifetime: until ``streamrank embeddings delete``.
                              Writer: ``streamrank publish`` (scoring.model.registry). Reader:
                              scoring workers loading the version.
model_graph           string  ``sr:{model:<version>}:onnx``: the version's DIN forward as an ONNX
                              graph (protobuf bytes), exported from the dense weights; absent
                              when published without ``streamrank[onnx]``. Written with the
                              dense weights.
                              Lifetime: until ``streamrank embeddings delete``.
                              Writer: ``streamrank publish``. Reader: scoring workers serving
                              with ``STREAMRANK_SCORING_RUNTIME=onnx``.
retrieval_chunk       string  ``sr:{model:<version>}:retrieval:<n>``: chunk ``n`` (0-based, a few
                              MB each) of the version's retrieval model (safetensors bytes: the
                              item ids in row order, the two-tower item vectors, their primary
                              categories and the user tower); the chunk count is in the config
                              (``retrieval.chunks.retrieval``), the joined bytes' sha256 in its
                              ``files.retrieval``. In the version's slot; written after the dense
                              weights.
                              Lifetime: until ``streamrank embeddings delete``.
                              Writer: ``streamrank publish`` (scoring.model.registry). Readers:
                              scoring workers loading the version (scoring.model.registry).
index_chunk           string  ``sr:{model:<version>}:index:<n>``: chunk ``n`` of the version's ANN
                              index (faiss bytes), as the retrieval chunks (count in
                              ``retrieval.chunks.index``, sha256 in ``files.index``).
                              Lifetime: until ``streamrank embeddings delete``.
                              Writer: ``streamrank publish``. Readers: scoring workers loading
                              the version.
model_config          string  ``sr:{model:<version>}:config``: the version's config.json (UTF-8
                              JSON; ``encoding`` = the one its item table was published in);
                              written LAST, so its presence means the version is fully published.
                              Lifetime: until ``streamrank embeddings delete``.
                              Writer: ``streamrank publish``. Readers: scoring workers,
                              ``streamrank activate`` and the rollout driver (is it published?).
group_members         hash    ``sr:{grp:<group>}:members``: the consumer group's members as they
                              report themselves: field = member (client id), value = JSON (host,
                              pid, partitions, since, expires). One key per group, its own tag.
                              Lifetime: each field is re-written every few seconds while its worker
                              runs; the key's TTL (and each ``expires``) drop members that are gone.
                              Writers: every worker (streamrank.runtime.groups). Readers: ``streamrank
                              lag`` and ``top`` (workbench.lag).
====================  ======  ======================================================================

Ids are embedded verbatim (the message contract forbids control characters in ids, so
``\\x1f`` can separate fields inside values). An id may contain braces: Redis takes the tag up
to the first ``}`` after the first ``{``, and every key of one user starts with the same
``sr:{u:<user>`` (and the tag is never empty), so all of one user's keys still share one slot
whatever the id holds (a property test checks it with Redis' own slot function).

The online outcome and rollout keys are built in :mod:`streamrank.outcome_keys` (its own table)
and re-exported here.
"""

from __future__ import annotations

import binascii
import functools
import zlib
from collections.abc import Iterable
from typing import Any

from streamrank.outcome_keys import (  # noqa: F401  (re-exported: one place to import keys from)
    outcome_clicks,
    outcome_due,
    outcome_due_member,
    outcome_items,
    outcome_open,
    outcome_seen,
    outcome_stats,
    outcome_versions,
    retrain_cycles,
    rollout_history,
    rollout_lease,
    rollout_state,
)

PREFIX = "sr"
FIELD_SEP = "\x1f"
ITEM_TABLE = "item"  # the embedding table a model version's item vectors are published as
# Shards of the item counters. Part of the contract: changing it moves every item's counters
# (they rebuild within 24 h, the longest window). 16 spreads one bucket over 16 slots (up to
# 16 masters) while a candidate list still reads at most 16 hashes per bucket.
ITEM_COUNTER_SHARDS = 16
CLUSTER_SLOTS = 16384  # Redis Cluster's hash slots (CRC16 of the tag modulo this)


def user_tag(user_id: str) -> str:
    """The hash tag (with braces) of every key of one user."""
    return f"{{u:{user_id}}}"


def sequence(user_id: str) -> str:
    """The behaviour-sequence zset of one user."""
    return f"{PREFIX}:{user_tag(user_id)}:seq"


def seen(user_id: str, event_id: str) -> str:
    """The dedupe marker of one event, in its user's slot."""
    return f"{PREFIX}:{user_tag(user_id)}:seen:{event_id}"


def user_counter_bucket(user_id: str, resolution_s: int, bucket_start_s: int) -> str:
    """One time bucket of a user's windowed counters."""
    return f"{PREFIX}:{user_tag(user_id)}:cnt:{resolution_s}:{bucket_start_s}"


def user_counter_buckets(user_id: str, resolution_s: int, starts: Iterable[int]) -> list[str]:
    """:func:`user_counter_bucket` of each of ``starts`` (one window's buckets)."""
    head = f"{PREFIX}:{user_tag(user_id)}:cnt:{resolution_s}:"
    return [f"{head}{start}" for start in starts]


def user_keys_pattern(user_glob: str) -> str:
    """SCAN MATCH pattern of every key of the users matching ``user_glob``."""
    return f"{PREFIX}:{{u:{user_glob}}}:*"


def item_shard(item_id: str) -> int:
    """The item-counter shard of an item: CRC-32 (zlib, IEEE) of its UTF-8 bytes modulo
    :data:`ITEM_COUNTER_SHARDS`."""
    return zlib.crc32(item_id.encode("utf-8")) % ITEM_COUNTER_SHARDS


def item_tag(shard: int) -> str:
    """The hash tag (with braces) of one item-counter shard."""
    return f"{{i:{shard}}}"


def item_counter_bucket(shard: int, resolution_s: int, bucket_start_s: int) -> str:
    """One time bucket of the click counters of one shard's items (field = item id)."""
    return f"{PREFIX}:{item_tag(shard)}:cnt:{resolution_s}:{bucket_start_s}"


def user_attributes(user_id: str) -> str:
    """The offline attributes of one user (hash: name -> value), in the user's slot."""
    return f"{PREFIX}:{user_tag(user_id)}:attr"


def item_attributes(shard: int) -> str:
    """The offline attributes of one shard's items (hash: item id -> JSON object)."""
    return f"{PREFIX}:{item_tag(shard)}:attr"


def item_counter_buckets(shard: int, resolution_s: int, starts: Iterable[int]) -> list[str]:
    """:func:`item_counter_bucket` of each of ``starts`` (one window's buckets)."""
    head = f"{PREFIX}:{item_tag(shard)}:cnt:{resolution_s}:"
    return [f"{head}{start}" for start in starts]


def item_seen(shard: int, event_id: str) -> str:
    """The dedupe marker of one event's item counts, in its item's shard."""
    return f"{PREFIX}:{item_tag(shard)}:seen:{event_id}"


@functools.cache
def _slot_tags() -> tuple[str, ...]:
    """The tag of each hash slot: ``{s:<n>}`` with the smallest n whose CRC16 lands there."""
    tags: list[str | None] = [None] * CLUSTER_SLOTS
    left, n = CLUSTER_SLOTS, 0
    while left:
        body = f"s:{n}"
        slot = binascii.crc_hqx(body.encode(), 0) % CLUSTER_SLOTS
        if tags[slot] is None:
            tags[slot] = f"{{{body}}}"
            left -= 1
        n += 1
    return tuple(t or "" for t in tags)


def slot_tag(slot: int) -> str:
    """The hash tag (with braces) of the keys that belong to one hash slot as a whole (the
    writer's per-slot-group keys): Redis Cluster puts it in ``slot``."""
    return _slot_tags()[slot]


def event_ids(slot: int, generation: int) -> str:
    """The event ids applied in one slot group during one dedupe generation (a set)."""
    return f"{PREFIX}:{slot_tag(slot)}:ids:{generation}"


def event_ids_pattern() -> str:
    """SCAN MATCH pattern of every slot group's event-id sets."""
    return f"{PREFIX}:{{s:*}}:ids:*"


def item_keys_pattern(what: str) -> str:
    """SCAN MATCH pattern of the item-shard keys of one kind: ``cnt`` (counter buckets) or
    ``seen:<event glob>`` (markers)."""
    return f"{PREFIX}:{{i:*}}:{what}*"


def embedding_meta(version: str, table: str) -> str:
    """Metadata hash of one embedding table of one model version."""
    return f"{PREFIX}:{{emb:{version}:{table}}}:meta"


def embedding_shard_tag(version: str, table: str, shard: int) -> str:
    """The hash tag (with braces) of one shard of an embedding table's buckets."""
    return f"{{emb:{version}:{table}:{shard}}}"


def embedding_publish_id(version: str, table: str, shard: int) -> str:
    """One shard's copy of the table's publish id (what the fetch script checks)."""
    return f"{PREFIX}:{embedding_shard_tag(version, table, shard)}:pid"


def embedding_overlay(version: str, table: str, shard: int) -> str:
    """Overlay rows of one shard of an embedding table (upserted after its publish)."""
    return f"{PREFIX}:{embedding_shard_tag(version, table, shard)}:ov"


def embedding_overlay_id(version: str, table: str, shard: int) -> str:
    """One shard's copy of the table's overlay id (what the fetch script replies)."""
    return f"{PREFIX}:{embedding_shard_tag(version, table, shard)}:ovid"


def embedding_shard(bucket: Any, shards: int) -> Any:
    """The shard of one bucket (an int, or a numpy array of them) of a table with ``shards``
    shards."""
    return bucket % shards


def embedding_bucket(version: str, table: str, bucket: int, shards: int) -> str:
    """One hash bucket of encoded rows of a table with ``shards`` shards."""
    tag = embedding_shard_tag(version, table, embedding_shard(bucket, shards))
    return f"{PREFIX}:{tag}:{bucket}"


def embedding_version_pattern(version: str) -> str:
    """SCAN MATCH pattern of every key of one embedding version (names carry no glob characters)."""
    return f"{PREFIX}:{{emb:{version}:*"


def embedding_table_pattern(version: str, table: str) -> str:
    """SCAN MATCH pattern of every key (meta, publish ids, rows) of one table of one version."""
    return f"{PREFIX}:{{emb:{version}:{table}[:}}]*"


def embedding_meta_pattern(version: str) -> str:
    """SCAN MATCH pattern of the metadata keys of one embedding version's tables."""
    return f"{PREFIX}:{{emb:{version}:*}}:meta"


def embedding_publish_id_pattern(version: str) -> str:
    """SCAN MATCH pattern of the shards' publish-id keys of one embedding version's tables."""
    return f"{PREFIX}:{{emb:{version}:*}}:pid"


def embedding_versions() -> str:
    """The set of published model versions."""
    return f"{PREFIX}:{{emb}}:versions"


def active_model() -> str:
    """The pointer to the serving model version."""
    return f"{PREFIX}:{{model}}:active"


def model_split() -> str:
    """The optional canary traffic split (same slot as the pointer: one MGET reads both)."""
    return f"{PREFIX}:{{model}}:split"


def sequence_member(
    event_id: str, item_id: str, category: str | None, action: str | None = None
) -> str:
    """The member of one event in a user's sequence (category or action ``None`` is stored
    empty)."""
    return f"{event_id}{FIELD_SEP}{item_id}{FIELD_SEP}{category or ''}{FIELD_SEP}{action or ''}"


def category_field(category: str) -> str:
    """The field of one category's count in a coarse user counter bucket."""
    return f"c:{category}"


def model_dense(version: str) -> str:
    """The dense weights (safetensors bytes) of one published model version."""
    return f"{PREFIX}:{{model:{version}}}:dense"


def model_graph(version: str) -> str:
    """The ONNX graph of one published model version's forward (its slot)."""
    return f"{PREFIX}:{{model:{version}}}:onnx"


def retrieval_chunk(version: str, chunk: int) -> str:
    """One chunk of the retrieval model of one published model version (its slot)."""
    return f"{PREFIX}:{{model:{version}}}:retrieval:{chunk}"


def index_chunk(version: str, chunk: int) -> str:
    """One chunk of the ANN index of one published model version (in the version's slot)."""
    return f"{PREFIX}:{{model:{version}}}:index:{chunk}"


def model_chunks_pattern(version: str, what: str) -> str:
    """SCAN MATCH pattern of the chunks of one model version's ``retrieval`` or ``index``."""
    return f"{PREFIX}:{{model:{version}}}:{what}:*"


def model_config(version: str) -> str:
    """The config.json of one published model version (written last by publish)."""
    return f"{PREFIX}:{{model:{version}}}:config"


def result_cache(user_id: str, version: str, variant: str) -> str:
    """One user's cached result of one version and request variant, in the user's slot."""
    return f"{PREFIX}:{user_tag(user_id)}:res:{version}:{variant}"


def group_members(group: str) -> str:
    """The self-reported members of one consumer group and their partitions (one key, its own
    tag)."""
    return f"{PREFIX}:{{grp:{group}}}:members"
