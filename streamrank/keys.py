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
``sr:cnt:{scope}:{id}:{res}:{bucket}``
                                hash    windowed counters of one entity in one time bucket;
                                        ``scope`` is ``u`` (user) or ``i`` (item), ``res`` the
                                        bucket resolution in seconds, ``bucket`` the bucket start
                                        (epoch s). Fields: ``n`` (events) and ``c:{category}``.
                                        Each bucket key expires by itself once no window can
                                        reach it (window + lateness after its end).
``sr:emb:{version}:{table}:meta``
                                hash    embedding table metadata: dim, encoding, rows, buckets,
                                        the OOV row (encoded), published_at.
``sr:emb:{version}:{table}:{bucket}``
                                hash    encoded rows: field = raw id, value = encoded row bytes;
                                        ``bucket`` = stable hash of the id modulo the bucket count,
                                        small enough for Redis' compact listpack encoding.
``sr:emb:versions``             set     published model versions.
``sr:model:active``             string  the serving model version (``streamrank activate``).
``sr:model:split``              string  optional canary split, e.g. ``din-a:0.9,din-b:0.1``.
``sr:model:{version}:dense``    string  the version's dense weights (safetensors bytes), written
                                        by ``streamrank publish`` after the item table.
``sr:model:{version}:config``   string  the version's config.json (UTF-8 JSON; ``encoding`` = the
                                        one its item table was published in); written LAST, so
                                        its presence means the version is fully published.
==============================  ======  ==========================================================
"""

from __future__ import annotations

PREFIX = "sr"
FIELD_SEP = "\x1f"


def sequence(user_id: str) -> str:
    """The behaviour-sequence zset of one user."""
    return f"{PREFIX}:seq:{user_id}"


def seen(event_id: str) -> str:
    """The dedupe marker of one event."""
    return f"{PREFIX}:seen:{event_id}"


def counter_bucket(scope: str, entity_id: str, resolution_s: int, bucket_start_s: int) -> str:
    """One time bucket of an entity's windowed counters (scope ``u`` or ``i``)."""
    return f"{PREFIX}:cnt:{scope}:{entity_id}:{resolution_s}:{bucket_start_s}"


def embedding_meta(version: str, table: str) -> str:
    """Metadata hash of one embedding table of one model version."""
    return f"{PREFIX}:emb:{version}:{table}:meta"


def embedding_bucket(version: str, table: str, bucket: int) -> str:
    """One hash bucket of encoded rows of one embedding table."""
    return f"{PREFIX}:emb:{version}:{table}:{bucket}"


def embedding_versions() -> str:
    """The set of published model versions."""
    return f"{PREFIX}:emb:versions"


def active_model() -> str:
    """The pointer to the serving model version."""
    return f"{PREFIX}:model:active"


def model_split() -> str:
    """The optional canary traffic split."""
    return f"{PREFIX}:model:split"


def model_dense(version: str) -> str:
    """The dense weights (safetensors bytes) of one published model version."""
    return f"{PREFIX}:model:{version}:dense"


def model_config(version: str) -> str:
    """The config.json of one published model version (written last by publish)."""
    return f"{PREFIX}:model:{version}:config"
