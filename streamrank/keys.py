"""The Redis key contract: every key streamrank reads or writes is built here, and only here.

All keys share the prefix ``sr:``. Ids are embedded verbatim (the message contract forbids
control characters in ids, so ``\\x1f`` can separate fields inside values).

==============================  ======  ==========================================================
key                             type    contents
==============================  ======  ==========================================================
``sr:seq:{user_id}``            zset    the user's latest events; score = event ts (epoch ms),
                                        member = ``event_id \\x1f item_id \\x1f category``. Equal
                                        scores sort by member bytes, i.e. by event_id: the
                                        (ts, event_id) order the offline training code uses.
                                        Capped at ``sequence_length``, TTL ``sequence_ttl_s``.
``sr:seen:{event_id}``          string  "1" once an event's effects are applied (dedupe for
                                        at-least-once replays); TTL ``dedupe_ttl_s``.
``sr:cnt:u:{user_id}:{res}:{bucket}``
                                hash    one user's clicks in one time bucket: ``res`` is the
                                        bucket size in seconds (``counter_bucket_s`` for the 1 h
                                        window, ``counter_coarse_bucket_s`` for 24 h),
                                        ``bucket`` the bucket start (epoch s). Fields: ``n``
                                        (clicks); coarse buckets also ``c:{category}``.
``sr:cnt:i:{res}:{bucket}``     hash    every item's clicks in one time bucket: field = item
                                        id, value = clicks (one HMGET per bucket answers a
                                        whole candidate list).
                                        Counter buckets expire by themselves (PEXPIREAT) once
                                        no window can reach them: bucket end + window +
                                        ``counter_lateness_s``.
``sr:emb:{version}:{table}:meta``
                                hash    embedding table metadata: dim, encoding, rows, buckets,
                                        oov (the encoded OOV row), published_at, publish_id.
                                        Written last: a table without it is not published.
``sr:emb:{version}:{table}:{bucket}``
                                hash    encoded rows: field = raw id, value = encoded row bytes;
                                        ``bucket`` (decimal) = scoring.embeddings.bucketing.bucket_of(id,
                                        buckets): stable hash of the id modulo the bucket count,
                                        chosen so every bucket stays in Redis' compact
                                        ziplist/listpack encoding. Never expires: deleted with
                                        its version (``streamrank embeddings delete``).
``sr:emb:versions``             set     published embedding versions (members = version names).
                                        Version and table names match ``[A-Za-z0-9][A-Za-z0-9._-]*``
                                        (no ``:`` and no glob characters), so the SCAN pattern
                                        ``sr:emb:{version}:*`` matches exactly one version's keys.
``sr:model:active``             string  the serving model version (``streamrank activate``).
``sr:model:split``              string  optional canary split, e.g. ``din-a:0.9,din-b:0.1``.
``sr:model:{version}:dense``    string  the version's dense weights (safetensors bytes), written
                                        by ``streamrank publish`` after the item table.
``sr:model:{version}:config``   string  the version's config.json (UTF-8 JSON; ``encoding`` = the
                                        one its item table was published in); written LAST, so
                                        its presence means the version is fully published.
``sr:grp:{group}:members``      hash    the consumer group's members as they report themselves
                                        (``streamrank.groups``): field = member (client id),
                                        value = JSON (host, pid, partitions, since, expires).
                                        Each worker re-writes its field every few seconds; the
                                        key's TTL (and ``expires``) drop members that are gone.
==============================  ======  ==========================================================
"""

from __future__ import annotations

PREFIX = "sr"
FIELD_SEP = "\x1f"
ITEM_TABLE = "item"  # the embedding table a model version's item vectors are published as


def sequence(user_id: str) -> str:
    """The behaviour-sequence zset of one user."""
    return f"{PREFIX}:seq:{user_id}"


def seen(event_id: str) -> str:
    """The dedupe marker of one event."""
    return f"{PREFIX}:seen:{event_id}"


def user_counter_bucket(user_id: str, resolution_s: int, bucket_start_s: int) -> str:
    """One time bucket of a user's windowed counters."""
    return f"{PREFIX}:cnt:u:{user_id}:{resolution_s}:{bucket_start_s}"


def item_counter_bucket(resolution_s: int, bucket_start_s: int) -> str:
    """One time bucket of all items' click counters (field = item id)."""
    return f"{PREFIX}:cnt:i:{resolution_s}:{bucket_start_s}"


def embedding_meta(version: str, table: str) -> str:
    """Metadata hash of one embedding table of one model version."""
    return f"{PREFIX}:emb:{version}:{table}:meta"


def embedding_bucket(version: str, table: str, bucket: int) -> str:
    """One hash bucket of encoded rows of one embedding table."""
    return f"{embedding_bucket_prefix(version, table)}{bucket}"


def embedding_bucket_prefix(version: str, table: str) -> str:
    """What precedes the decimal bucket number in a bucket key (the fetch script appends it)."""
    return f"{PREFIX}:emb:{version}:{table}:"


def embedding_version_pattern(version: str) -> str:
    """SCAN MATCH pattern of every key of one embedding version (names carry no glob characters)."""
    return f"{PREFIX}:emb:{version}:*"


def embedding_table_pattern(version: str, table: str) -> str:
    """SCAN MATCH pattern of every key (rows and meta) of one table of one embedding version."""
    return f"{PREFIX}:emb:{version}:{table}:*"


def embedding_meta_pattern(version: str) -> str:
    """SCAN MATCH pattern of the metadata keys of one embedding version's tables."""
    return f"{PREFIX}:emb:{version}:*:meta"


def embedding_versions() -> str:
    """The set of published model versions."""
    return f"{PREFIX}:emb:versions"


def active_model() -> str:
    """The pointer to the serving model version."""
    return f"{PREFIX}:model:active"


def model_split() -> str:
    """The optional canary traffic split."""
    return f"{PREFIX}:model:split"


def sequence_member(event_id: str, item_id: str, category: str | None) -> str:
    """The member of one event in ``sr:seq:{user_id}`` (category ``None`` is stored empty)."""
    return f"{event_id}{FIELD_SEP}{item_id}{FIELD_SEP}{category or ''}"


def category_field(category: str) -> str:
    """The field of one category's count in a coarse user counter bucket."""
    return f"c:{category}"


def model_dense(version: str) -> str:
    """The dense weights (safetensors bytes) of one published model version."""
    return f"{PREFIX}:model:{version}:dense"


def model_config(version: str) -> str:
    """The config.json of one published model version (written last by publish)."""
    return f"{PREFIX}:model:{version}:config"


def group_members(group: str) -> str:
    """The self-reported members of one consumer group and their partitions."""
    return f"{PREFIX}:grp:{group}:members"
