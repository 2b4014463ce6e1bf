"""The Redis keys of online outcomes and rollouts (re-exported by :mod:`streamrank.keys`).

They carry no hash tag yet: the outcomes join script touches one user's keys together with the
global ``due``/``stats``/``versions`` keys, so the outcomes worker and the rollout run on a
standalone or Sentinel Redis only and refuse a Redis Cluster with a clear error. Every per-user
and per-request key takes the user id first, so a re-tagging happens in these functions alone.

====================  ======  ======================================================================
builder               type    key, contents, lifetime, writer and readers
====================  ======  ======================================================================
outcome_open          hash    ``sr:out:open:<user>``: the user's served records whose attribution
                              window is open: field = request_id, value = the pending record
                              (JSON: version, served_at, items, scores, ranks, clicks so far, its
                              stats key).
                              Lifetime: removed when the record closes; TTL window + close delay +
                              a margin, renewed on every write (cleans up after a closer that never
                              ran). Writer and reader: outcomes workers (scoring.rollout.join).
outcome_items         hash    ``sr:out:items:<user>``: last-touch index: field = item id, value =
                              the ``\\x1f``-joined request ids of the user's open records that
                              ranked the item (newest last).
                              Lifetime: as ``outcome_open``. Writer and reader: outcomes workers.
outcome_clicks        zset    ``sr:out:clicks:<user>``: the user's clicks no open record claimed
                              yet (score = click ts, member = ``event_id \\x1f item_id``): a served
                              record processed after its click still gets it.
                              Lifetime: trimmed to the attribution window; TTL as
                              ``outcome_open``. Writer and reader: outcomes workers.
outcome_seen          string  ``sr:out:seen:<user>:<request_id>``: "1" once a served record is
                              joined (dedupe under redelivery).
                              Lifetime: TTL ``dedupe_ttl_s``. Writer and reader: outcomes workers.
outcome_due           zset    ``sr:out:due``: open records by close time (member = ``user \\x1f
                              request_id``, :func:`outcome_due_member`; score = epoch ms); a closer
                              claims entries by moving them forward.
                              Lifetime: no TTL; an entry is removed when its record closes.
                              Writer and reader: outcomes workers.
outcome_stats         hash    ``sr:out:stats:<bucket_s>:<version>:<start>``: one version's online
                              statistics of the requests served in one time bucket (``start`` =
                              bucket start, epoch s): counters, sums and score/latency histograms
                              (scoring.rollout.stats).
                              Lifetime: TTL ``outcome_retention_s``, renewed on every write.
                              Writer: outcomes workers. Readers (scoring.rollout.online): the
                              rollout driver, ``streamrank rollout status``, the outcomes
                              workers' metrics.
outcome_versions      zset    ``sr:out:versions``: versions that have statistics (score = the latest
                              served_at, epoch ms).
                              Lifetime: no TTL (one member per version ever served).
                              Writer: outcomes workers. Readers: as ``outcome_stats``.
rollout_state         hash    ``sr:rollout:state``: the staged rollout (new, old, steps, step,
                              since, status, guard ...; ``rev`` counts transitions).
                              Lifetime: no TTL; replaced when a rollout starts.
                              Writer and readers: ``streamrank rollout`` and its driver
                              (scoring.rollout.state, compare-and-set transitions).
rollout_history       list    ``sr:rollout:history``: the rollout's decisions, JSON, oldest first.
                              Lifetime: the last ``HISTORY_KEEP`` entries; cleared when a rollout
                              starts. Writer and readers: as ``rollout_state``.
rollout_lease         string  ``sr:rollout:lease``: the driver holding the lease (owner id).
                              Lifetime: PX TTL ``lease_s``, renewed by its holder.
                              Writer: the rollout driver. Readers: the driver, ``streamrank
                              rollout status``.
retrain_cycles        list    ``sr:retrain:cycles``: the retrain loop's cycles, JSON, newest first
                              (when, outcome, candidate and active version, gate figures).
                              Lifetime: the last ``CYCLES_KEEP`` entries.
                              Writer: ``streamrank retrain`` (scoring.rollout.cycles). Readers:
                              ``streamrank rollout status``, the outcomes workers' metrics.
====================  ======  ======================================================================
"""

from __future__ import annotations

PREFIX = "sr"  # as streamrank.keys (which imports this module, so it cannot import that)
FIELD_SEP = "\x1f"


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


def retrain_cycles() -> str:
    """The retrain loop's cycles (list of JSON, newest first)."""
    return f"{PREFIX}:retrain:cycles"
