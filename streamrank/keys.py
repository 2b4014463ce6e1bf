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

Online outcomes and rollouts (issue 14; a separate section so that a re-tagging for Redis Cluster
changes these functions in one place: every per-user key takes the user id, every per-request
key takes the user id too, so all of one user's keys can share the user's hash tag):

====================================  ======  ====================================================
key                                   type    contents
====================================  ======  ====================================================
``sr:out:open:{user_id}``             hash    the user's served records whose attribution window
                                              is open: field = request_id, value = the pending
                                              record (JSON: version, served_at, items, scores,
                                              ranks, clicks so far, its stats key). TTL: window +
                                              close delay + margin, renewed on every write.
``sr:out:items:{user_id}``            hash    last-touch index: field = item id, value = the
                                              ``\x1f``-joined request ids of the user's open
                                              records that ranked the item (newest last).
``sr:out:clicks:{user_id}``           zset    the user's clicks no open record claimed yet
                                              (score = click ts, member = ``event_id \x1f
                                              item_id``): a served record processed after its
                                              click still gets it. Same TTL.
``sr:out:seen:{user_id}:{request_id}``
                                      string  "1" once a served record is joined (dedupe under
                                              redelivery); TTL ``dedupe_ttl_s``.
``sr:out:due``                        zset    open records by close time (member = ``user_id
                                              \x1f request_id``, score = epoch ms); a closer
                                              claims entries by moving them forward.
``sr:out:stats:{bucket_s}:{version}:{start}``
                                      hash    one version's online statistics of the requests
                                              served in one time bucket (``start`` = bucket
                                              start, epoch s): counters, sums and score/latency
                                              histograms (scoring.rollout.stats). TTL
                                              ``outcome_retention_s``.
``sr:out:versions``                   zset    versions that have statistics (score = the latest
                                              served_at, epoch ms).
``sr:rollout:state``                  hash    the staged rollout (new, old, steps, step, since,
                                              status, guard ...; ``rev`` counts transitions).
``sr:rollout:history``                list    the rollout's decisions, JSON, oldest first.
``sr:rollout:lease``                  string  the driver holding the lease (owner id); PX TTL.
====================================  ======  ====================================================
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


# --- online outcomes and rollouts (issue 14) ----------------------------------------------------
# Built by these functions only; per-user and per-request keys take the user id first, so one
# hash tag per user can be added here without touching their callers.


def outcome_open(user_id: str) -> str:
    """The user's pending served records (hash: request_id -> JSON)."""
    return f"{PREFIX}:out:open:{user_id}"


def outcome_items(user_id: str) -> str:
    """The user's last-touch index (hash: item id -> request ids of open records ranking it)."""
    return f"{PREFIX}:out:items:{user_id}"


def outcome_clicks(user_id: str) -> str:
    """The user's clicks not attributed to any open record yet (zset by click ts)."""
    return f"{PREFIX}:out:clicks:{user_id}"


def outcome_seen(user_id: str, request_id: str) -> str:
    """The marker of a joined served record."""
    return f"{PREFIX}:out:seen:{user_id}:{request_id}"


def outcome_due() -> str:
    """Open records by close time (member = ``user_id \\x1f request_id``)."""
    return f"{PREFIX}:out:due"


def outcome_due_member(user_id: str, request_id: str) -> str:
    """The member of one open record in :func:`outcome_due`."""
    return f"{user_id}{FIELD_SEP}{request_id}"


def outcome_stats(bucket_s: int, version: str, bucket_start_s: int) -> str:
    """One version's online statistics for the requests served in one time bucket."""
    return f"{PREFIX}:out:stats:{bucket_s}:{version}:{bucket_start_s}"


def outcome_versions() -> str:
    """Versions with online statistics (zset: version -> latest served_at)."""
    return f"{PREFIX}:out:versions"


def rollout_state() -> str:
    """The staged rollout's state (hash)."""
    return f"{PREFIX}:rollout:state"


def rollout_history() -> str:
    """The staged rollout's decisions (list of JSON, oldest first)."""
    return f"{PREFIX}:rollout:history"


def rollout_lease() -> str:
    """The lease of the one rollout driver allowed to act (string: owner id)."""
    return f"{PREFIX}:rollout:lease"
