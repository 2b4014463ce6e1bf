"""One error tree for the whole engine.

Every error says what went wrong and what to do about it. ``retriable`` tells a caller whether
the same call may succeed later (a dependency was down) or never will (bad input, bad config).
"""

from __future__ import annotations


class StreamrankError(Exception):
    """Base of every error streamrank raises on purpose."""

    retriable: bool = False


class ConfigError(StreamrankError):
    """A setting or argument is wrong; fix it and run again."""


class StackError(StreamrankError):
    """The embedded Kafka/Redis stack could not be started, stopped or reached."""


class ContractError(StreamrankError):
    """A message does not follow its contract.

    ``field`` names the offending field (None for whole-message faults); ``reason`` is a short
    machine-readable code (``not_json``, ``missing_field``, ``bad_type``, ``too_large`` ...)
    used as a metric label and in dead letters.
    """

    def __init__(self, message: str, *, field: str | None = None, reason: str = "invalid") -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason


# Reasons of a record that could not be processed (dead letters, metric labels); a reply's
# reason "internal_error" is another code, of another message (schemas.reasons.INTERNAL_ERROR).
INTERNAL_RECORD_ERROR = "internal_error"  # an unexpected exception on one record
UNDECODABLE_BATCH = "undecodable_batch"  # a record batch was skipped


def one_line(exc: BaseException) -> str:
    """An exception's one-line summary: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def internal_error(exc: BaseException) -> ContractError:
    """An unexpected exception on one record, as the error that dead-letters that record (and
    only it): reason ``internal_error``, message the exception's one-line summary."""
    return ContractError(one_line(exc), reason=INTERNAL_RECORD_ERROR)


class DependencyUnavailable(StreamrankError):
    """Kafka or Redis did not answer in time; the same call may succeed later."""

    retriable = True


class RedisUnavailable(DependencyUnavailable):
    """Redis did not answer (connection refused, timeout, breaker open)."""


class KafkaUnavailable(DependencyUnavailable):
    """The Kafka cluster did not answer."""


class EmbeddingError(StreamrankError):
    """Bad embedding input (shape, dtype, NaN/Inf, duplicate ids) or an unknown table/version."""


class UnknownVersion(EmbeddingError):
    """The model version is not published in the embedding store."""


class ArtifactError(StreamrankError):
    """A model artifact is missing, corrupt or does not match its config."""


class RuntimeUnavailable(StreamrankError):
    """The configured inference runtime cannot run here (no C++ compiler, a package missing)."""


class DatasetError(StreamrankError):
    """A dataset could not be downloaded, or its files do not match their pinned checksums."""
