"""Message settings: the topics of the engine and the limits every message must keep."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from streamrank.settings.base import CsvTuple, Section


class TopicSettings(Section):
    """Topic names, and how ``streamrank topics create`` makes them."""

    env_prefix = "STREAMRANK_TOPIC_"
    env_names: ClassVar[Mapping[str, str]] = {
        "reply_allowed": "STREAMRANK_REPLY_TOPICS_ALLOWED",
        "served_log": "STREAMRANK_SERVED_LOG_TOPIC",
        "outcomes": "STREAMRANK_OUTCOMES_TOPIC",
        "items": "STREAMRANK_ITEMS_TOPIC",
    }

    clicks: str = Field("clicks", description="ClickEvent topic (key = user_id).")
    requests: str = Field("rank-requests", description="RankRequest topic (key = user_id).")
    results: str = Field("rank-results", description="RankResult topic (key = request_id).")
    dead_letters: str = Field("dead-letters", description="DeadLetter topic.")
    items: str = Field(
        "items",
        description="ItemEvent topic (key = item_id): new or changed items, written by the "
        "features worker into the item attribute table (cold-start scoring reads it).",
    )
    partitions: int = Field(4, ge=1, description="Partitions per topic: bounds group scale-out.")
    replication: int = Field(1, ge=1, description="Replication factor of created topics.")
    reply_allowed: CsvTuple = Field(
        (), description="Extra topics a RankRequest may name in reply_to (comma-separated)."
    )
    served_log: str | None = Field(None, description="Topic for what-the-model-saw records.")
    outcomes: str | None = Field(
        None,
        description="Topic the outcomes worker writes each final outcome to (key = request_id: "
        "which ranked items were clicked, at which rank); unset: none written.",
    )

    def names(self) -> tuple[str, ...]:
        """Every topic named here (the served log and outcomes topics when set)."""
        base = (self.clicks, self.requests, self.results, self.dead_letters, self.items)
        return base + tuple(t for t in (self.served_log, self.outcomes) if t)


class LimitSettings(Section):
    """Limits every incoming message is checked against (size, ids, candidates, event time)."""

    max_message_bytes: int = Field(
        64 * 1024, ge=256, description="Larger messages are dead-lettered."
    )
    max_items_per_request: int = Field(
        500, ge=1, description="Candidates allowed in one RankRequest."
    )
    max_id_length: int = Field(128, ge=1, description="Longest id (user, item, event, request).")
    max_event_skew_s: int = Field(
        7 * 24 * 3600,
        ge=1,
        description="Clicks whose ts is further than this from now are dead-lettered.",
    )
