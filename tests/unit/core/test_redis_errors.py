"""Redis failover and restart errors are retriable, as redis-py really raises them.

The replies are parsed by redis-py's own error parser (what a connection does with a ``-ERR``
line), with the texts Redis 6.2 really sends: ``READONLY`` from a replica, ``LOADING`` during a
restart, and the script error that wraps a ``READONLY`` raised inside a Lua script (measured on
the embedded redis-server: a plain ``ResponseError``, which used to crash the features worker).
"""

from __future__ import annotations

import pytest
from redis._parsers.base import BaseParser
from redis.exceptions import ResponseError

from streamrank.errors import RedisUnavailable
from streamrank.redis.errors import is_failover_reply, is_transient, redis_call

READONLY = "READONLY You can't write against a read only replica."
LOADING = "LOADING Redis is loading the dataset in memory"
MASTERDOWN = "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."
SCRIPT_READONLY = (
    "ERR Error running script (call to f_1758343caa5f4c188f25bf04d1bbc587a30fb340): "
    "@user_script:1: @user_script: 1: -READONLY You can't write against a read only replica."
)
NOT_TRANSIENT = [
    "WRONGTYPE Operation against a key holding the wrong kind of value",
    "ERR Error running script (call to f_ab): @user_script:3: user_script:3: attempt to "
    "compare nil with number",
    "NOSCRIPT No matching script. Please use EVAL.",
    "ERR unknown command 'READONLYX'",
]


@pytest.mark.parametrize("reply", [READONLY, LOADING, MASTERDOWN, SCRIPT_READONLY])
def test_failover_and_restart_replies_become_redis_unavailable(reply: str) -> None:
    error = BaseParser.parse_error(reply)
    assert is_transient(error)
    with (
        pytest.raises(RedisUnavailable, match="the feature batch") as caught,
        redis_call("the feature batch", "it is retried"),
    ):
        raise error
    assert caught.value.retriable and caught.value.__cause__ is error


def test_a_script_error_wrapping_readonly_is_a_plain_response_error() -> None:
    """Why the text is inspected: redis-py gives no ReadOnlyError for it."""
    error = BaseParser.parse_error(SCRIPT_READONLY)
    assert type(error) is ResponseError
    assert is_failover_reply(error)


@pytest.mark.parametrize("reply", NOT_TRANSIENT)
def test_other_errors_stay_what_they_are(reply: str) -> None:
    error = BaseParser.parse_error(reply)
    assert not is_transient(error)
    with pytest.raises(type(error)), redis_call("reading"):
        raise error


def test_connection_resets_are_transient() -> None:
    with pytest.raises(RedisUnavailable, match="ConnectionResetError"), redis_call("reading"):
        raise ConnectionResetError(104, "Connection reset by peer")
