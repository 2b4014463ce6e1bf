"""The one translation of Redis failures into the error tree, used by every Redis adapter.

A Redis that does not answer, times out, is loading its dataset after a restart, or is a
replica that has just lost its master role (``READONLY`` during a failover) may answer the same
call a moment later: all of these become :class:`~streamrank.errors.RedisUnavailable`
(retriable). Anything else Redis says (a wrong type, a script error) is a bug or bad data and
is left as it is.

A failover error raised *inside* a Lua script does not reach redis-py with its own error code:
Redis 6.2 wraps it in a script error (``ERR Error running script ...: -READONLY You can't write
against a read only replica.``), which redis-py raises as a plain ``ResponseError``. Such a
script error is recognised by the failover code it carries (:func:`is_failover_reply`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import BusyLoadingError, MasterDownError, ReadOnlyError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamrank.errors import RedisUnavailable

# BusyLoadingError is a ConnectionError; listed for the reader. OSError: a socket error that
# escapes redis-py while the server goes away mid-reply (seen with the features worker's writes
# when Redis was stopped under load).
TRANSIENT: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    OSError,
)

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
    """Whether the same Redis call may succeed later (see :data:`TRANSIENT`)."""
    return isinstance(exc, TRANSIENT) or is_failover_reply(exc)


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
    except TRANSIENT as exc:
        raise unavailable(exc, doing, then) from exc
    except ResponseError as exc:
        if is_failover_reply(exc):
            raise unavailable(exc, doing, then) from exc
        raise
