"""The one translation of Redis failures into the error tree, used by every Redis adapter.

A Redis that does not answer, times out, is loading its dataset after a restart, or is a
replica that has just lost its master role (``READONLY`` during a failover) may answer the same
call a moment later. So may a Redis Cluster while a slot has no master (``CLUSTERDOWN``, a slot
the client finds uncovered, a replica answering ``MASTERDOWN``), while a slot moves between
nodes (``TRYAGAIN`` for a multi-key command whose keys are split, an ``ASK``/``MOVED`` chain the
client gives up on: ``ClusterError("TTL exhausted")``), when no startup node answers, or when a
node's connection pool is exhausted (``MaxConnectionsError``). All of these become
:class:`~streamrank.errors.RedisUnavailable` (retriable). Anything else Redis says (a wrong
type, a script error, a cross-slot command: a bug of ours) is left as it is.

A failover error raised *inside* a Lua script does not reach redis-py with its own error code:
Redis 6.2 wraps it in a script error (``ERR Error running script ...: -READONLY You can't write
against a read only replica.``), which redis-py raises as a plain ``ResponseError``. Such a
script error is recognised by the failover code it carries (:func:`is_failover_reply`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterError,
    MasterDownError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamrank.errors import RedisUnavailable

# BusyLoadingError and MaxConnectionsError are ConnectionErrors, MasterDownError and
# ClusterDownError ClusterErrors, MovedError an AskError: listed by their bases. OSError: a
# socket error that escapes redis-py when the server goes away mid-reply (Redis stopped under a
# write load). SlotNotCoveredError is not a RedisError (redis-py raises it before sending).
TRANSIENT: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    ClusterError,
    TryAgainError,
    AskError,
    SlotNotCoveredError,
    OSError,
)
# What redis-py's cluster client says when it cannot build a slot map (no startup node answers,
# or they disagree during a failover); the other RedisClusterExceptions are usage errors.
_CLUSTER_OUTAGES = ("cannot be connected", "slots are not covered", "could not agree")


# Error codes of a server that will answer again once a failover or restart is over: a replica
# refusing writes, a dataset loading, a replica whose master link is down.
FAILOVER_CODES = ("READONLY", "LOADING", "MASTERDOWN")
_FAILOVER_REPLY = re.compile(r"(?:^|-)(?:" + "|".join(FAILOVER_CODES) + r")\b")


def is_failover_reply(exc: BaseException) -> bool:
    """True for a ``ResponseError`` that carries a failover code, also wrapped in a script
    error (see the module doc). redis-py strips the code of the errors it has a class for."""
    if isinstance(exc, MasterDownError):
        return True
    return isinstance(exc, ResponseError) and bool(_FAILOVER_REPLY.search(str(exc)))


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a Redis failure that the same call may not meet a moment later (see
    :data:`TRANSIENT`, :func:`is_failover_reply` and the module doc)."""
    if isinstance(exc, TRANSIENT) or is_failover_reply(exc):
        return True
    if isinstance(exc, RedisClusterException):
        return isinstance(exc.__cause__, TRANSIENT) or any(m in str(exc) for m in _CLUSTER_OUTAGES)
    return False


def unavailable(exc: BaseException, doing: str, then: str = "") -> RedisUnavailable:
    """The retriable error for a transient Redis failure while ``doing`` something; ``then``
    says what happens next or what to check."""
    tail = f"; {then}" if then else ""
    return RedisUnavailable(f"Redis did not answer {doing} ({type(exc).__name__}: {exc}){tail}")


@contextmanager
def redis_call(doing: str, then: str = "") -> Iterator[None]:
    """``with redis_call("reading sequences"): await ...``: transient Redis failures inside
    become :class:`RedisUnavailable` naming what was being done (and ``then``)."""
    try:
        yield
    except Exception as exc:
        if is_transient(exc):
            raise unavailable(exc, doing, then) from exc
        raise
