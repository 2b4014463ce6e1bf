"""Log lines: plain text (default) or one JSON object per line (``STREAMRANK_LOG_FORMAT=json``).

In JSON every field passed as ``extra=`` becomes a key of its own, so a line about a request
carries ``request_id``, ``user_id`` and ``model_version`` (:func:`request_fields`) and a line
about a consumed record ``topic``, ``partition`` and ``offset`` (:func:`record_fields`): one
request can be followed through the features and the scoring workers with ``jq``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from pythonjsonlogger.json import JsonFormatter

__all__ = [
    "JsonFormatter",
    "configure",
    "dict_config",
    "formatter",
    "record_fields",
    "request_fields",
]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``log_format`` (``text`` or ``json``)."""
    if log_format == "json":
        return JsonFormatter(
            _JSON_FIELDS,
            rename_fields={"asctime": "ts", "levelname": "level", "name": "logger"},
            timestamp=False,
        )
    return logging.Formatter(TEXT_FORMAT)


def configure(level: str, log_format: str) -> None:
    """Root logging to stderr in ``log_format`` at ``level`` (the CLI calls it once)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def dict_config(level: str, log_format: str) -> dict[str, Any]:
    """The same configuration for libraries that take a ``logging.config.dictConfig`` (Faust's
    worker replaces the root handlers with its own otherwise)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"streamrank": {"()": lambda: formatter(log_format)}},
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "stream": sys.stderr,
                "formatter": "streamrank",
            }
        },
        "root": {"level": level.upper(), "handlers": ["default"]},
    }


def record_fields(topic: str, partition: int, offset: int, **more: Any) -> dict[str, Any]:
    """``extra=`` of a line about one consumed record."""
    return {"topic": topic, "partition": partition, "offset": offset, **more}


def request_fields(
    request_id: str | None, user_id: str | None, model_version: str | None = None, **more: Any
) -> dict[str, Any]:
    """``extra=`` of a line about one ranking request."""
    return {
        "request_id": request_id,
        "user_id": user_id,
        "model_version": model_version,
        **more,
    }
