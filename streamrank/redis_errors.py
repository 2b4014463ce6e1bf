"""The one translation of Redis failures into the error tree, used by every Redis adapter.

A Redis that does not answer, times out, is loading its dataset after a restart, or is a
replica that has just lost its master role (``READONLY`` during a failover) may answer the same
call a moment later: all of these become :class:`~streamrank.errors.RedisUnavailable`
(retriable). Anything else Redis says (a wrong type, a script error) is a bug or bad data and
is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import BusyLoadingError, ReadOnlyError
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
