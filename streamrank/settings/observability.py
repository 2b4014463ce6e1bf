"""Logs and metrics of every process."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrank.settings.base import Section


class ObservabilitySettings(Section):
    """Logs and the /metrics port of every worker."""

    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="/metrics port; 0 disables; unset = per-worker default."
    )
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING, ERROR.")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text, or json: one JSON object per line with request_id, user_id and "
        "model_version on lines about a request and topic/partition/offset on lines about a "
        "record (docs/operations.md, Logs).",
    )
