"""The Redis key contract: every key streamrank reads or writes is built here, and only here.

One contract for standalone Redis, Sentinel and Redis Cluster. Every key carries a **hash tag**
(the part in ``{...}``): Redis Cluster places a key by the CRC16 of its tag alone, so keys with
one tag always share a hash slot, and every multi-key operation of streamrank (a Lua script, an
``MGET``) touches keys of one tag only. On standalone Redis the braces are plain characters.

=====================================  ======  ===================================================
key                                    type    contents
=====================================  ======  ===================================================
``sr:{u:<user>}:seq``                  zset    the user's latest events; score = event ts (epoch
                                               ms), member = ``event_id \\x1f item_id \\x1f
                                               category``. Equal scores sort by member bytes,
                                               i.e. by event_id: the (ts, event_id) order the
                                               offline training code uses. Capped at
                                               ``sequence_length``, TTL ``sequence_ttl_s``.
``sr:{u:<user>}:seen:<event_id>``      string  "1" once the event's effects on its user's keys
                                               are applied (dedupe for at-least-once replays);
                                               TTL ``dedupe_ttl_s``. Per user: an event belongs
                                               to one user, so the marker and the effects it
                                               gates share a slot.
``sr:{u:<user>}:cnt:<res>:<bucket>``   hash    one user's clicks in one time bucket: ``res`` is
                                               the bucket size in seconds (``counter_bucket_s``
                                               for the 1 h window, ``counter_coarse_bucket_s``
                                               for 24 h), ``bucket`` the bucket start (epoch s).
                                               Fields: ``n`` (clicks); coarse buckets also
                                               ``c:{category}``.
``sr:{i:<shard>}:cnt:<res>:<bucket>``  hash    the clicks in one time bucket of the items of one
                                               shard: field = item id, value = clicks. ``shard``
                                               = :func:`item_shard` (CRC-32 of the id modulo
                                               :data:`ITEM_COUNTER_SHARDS`), so one bucket of
                                               every item is that many keys in as many slots,
                                               not one hot key.
``sr:{i:<shard>}:seen:<event_id>``     string  "1" once the event's item counts are applied: the
                                               item shard's own dedupe marker (the user's marker
                                               lives in another slot, and no script spans two).
                                               Expires with the event's last counter bucket.
                                               Counter buckets expire by themselves (PEXPIREAT)
                                               once no window can reach them: bucket end +
                                               window + ``counter_lateness_s``.
``sr:{emb:<version>:<table>}:meta``    hash    embedding table metadata: dim, encoding, rows,
                                               buckets, shards, oov (the encoded OOV row),
                                               published_at, publish_id. Written last: a table
                                               without it is not published.
``sr:{emb:<version>:<table>:<shard>}:pid``
                                       string  the table's publish_id, once per shard: the fetch
                                               script checks it in the slot it reads (the meta is
                                               in another).
``sr:{emb:<version>:<table>:<shard>}:<bucket>``
                                       hash    encoded rows: field = raw id, value = encoded row
                                               bytes; ``bucket`` (decimal) =
                                               scoring.embeddings.bucketing.bucket_of(id,
                                               buckets), ``shard`` = bucket modulo the table's
                                               shard count (``shards`` in the meta). Buckets are
                                               small enough to stay in Redis' compact
                                               ziplist/listpack encoding. Never expires: deleted
                                               with its version (``streamrank embeddings delete``).
``sr:{emb}:versions``                  set     published embedding versions (members = version
                                               names). Version and table names match
                                               ``[A-Za-z0-9][A-Za-z0-9._-]*`` (no ``:``, braces or
                                               glob characters), so the SCAN pattern
                                               ``sr:{emb:<version>:*`` matches exactly one
                                               version's keys.
``sr:{model}:active``                  string  the serving model version (``streamrank activate``).
``sr:{model}:split``                   string  optional canary split, e.g. ``din-a:0.9,din-b:0.1``.
``sr:{model:<version>}:dense``         string  the version's dense weights (safetensors bytes),
                                               written by ``streamrank publish`` after the item
                                               table.
``sr:{model:<version>}:config``        string  the version's config.json (UTF-8 JSON;
                                               ``encoding`` = the one its item table was
                                               published in); written LAST, so its presence means
                                               the version is fully published.
``sr:{grp:<group>}:members``           hash    the consumer group's members as they report
                                               themselves (``streamrank.groups``): field =
                                               member (client id), value = JSON (host, pid,
                                               partitions, since, expires). Each worker re-writes
                                               its field every few seconds; the key's TTL (and
                                               ``expires``) drop members that are gone. One key
                                               per group, its own tag (only single-key commands).
=====================================  ======  ===================================================

Ids are embedded verbatim (the message contract forbids control characters in ids, so
``\\x1f`` can separate fields inside values). An id may contain braces: Redis takes the tag up
to the first ``}`` after the first ``{``, and every key of one user starts with the same
``sr:{u:<user>`` (and the tag is never empty), so all of one user's keys still share one slot
whatever the id holds (a property test checks it with Redis' own slot function).
"""

from __future__ import annotations

import zlib
from typing import Any

PREFIX = "sr"
FIELD_SEP = "\x1f"
ITEM_TABLE = "item"  # the embedding table a model version's item vectors are published as
# Shards of the item counters. Part of the contract: changing it moves every item's counters
# (they rebuild within 24 h, the longest window). 16 spreads one bucket over 16 slots (up to
# 16 masters) while a candidate list still reads at most 16 hashes per bucket.
ITEM_COUNTER_SHARDS = 16


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


def item_seen(shard: int, event_id: str) -> str:
    """The dedupe marker of one event's item counts, in its item's shard."""
    return f"{PREFIX}:{item_tag(shard)}:seen:{event_id}"


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


def sequence_member(event_id: str, item_id: str, category: str | None) -> str:
    """The member of one event in a user's sequence (category ``None`` is stored empty)."""
    return f"{event_id}{FIELD_SEP}{item_id}{FIELD_SEP}{category or ''}"


def category_field(category: str) -> str:
    """The field of one category's count in a coarse user counter bucket."""
    return f"c:{category}"


def model_dense(version: str) -> str:
    """The dense weights (safetensors bytes) of one published model version."""
    return f"{PREFIX}:{{model:{version}}}:dense"


def model_config(version: str) -> str:
    """The config.json of one published model version (written last by publish)."""
    return f"{PREFIX}:{{model:{version}}}:config"


def group_members(group: str) -> str:
    """The self-reported members of one consumer group and their partitions (one key, its own
    tag)."""
    return f"{PREFIX}:{{grp:{group}}}:members"
