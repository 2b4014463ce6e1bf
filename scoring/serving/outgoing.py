"""What the scoring worker produces for a batch: replies (counted and logged here) and, when
logging what was served, served-log records."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import ConsumerRecord

from schemas import RankResult, reasons
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.service import Ranked
from streamrank.runtime import logs

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Outgoing:
    """One record to produce."""

    topic: str
    key: bytes
    value: bytes


class ReplyWriter:
    """Turns results into :class:`Outgoing` records, counting each reply by outcome."""

    def __init__(self, *, metrics: ScoringMetrics, served_log_topic: str | None) -> None:
        self._metrics = metrics
        self._log_topic = served_log_topic

    def reply(self, topic: str, result: RankResult, record: ConsumerRecord[Any, Any]) -> Outgoing:
        """The reply to ``record``'s request, on ``topic``."""
        error = reasons.is_error_reply(result)
        self._metrics.observe_reply(
            degraded=result.degraded, reason=result.reason, error=error, topic=topic
        )
        if not error:
            self._metrics.observe_stages(result.timings_ms)
        if logger.isEnabledFor(logging.DEBUG):
            _log_reply(topic, result, record, error=error)
        return Outgoing(topic, result.request_id.encode(), result.to_json())

    def ranked(
        self,
        topics: Sequence[str],
        records: Sequence[ConsumerRecord[Any, Any]],
        ranked: Sequence[Ranked],
    ) -> list[Outgoing]:
        """The replies of ranked requests (aligned with their reply topics and records), and
        their served-log records when logging."""
        out: list[Outgoing] = []
        for topic, record, item in zip(topics, records, ranked, strict=True):
            out.append(self.reply(topic, item.result, record))
            if item.served is not None and self._log_topic:
                key = item.result.request_id.encode()
                out.append(Outgoing(self._log_topic, key, orjson.dumps(item.served)))
        return out


def _log_reply(
    topic: str, result: RankResult, record: ConsumerRecord[Any, Any], *, error: bool
) -> None:
    logger.debug(
        "reply to %s on %s: %s",
        result.request_id,
        topic,
        "error" if error else result.reason or "ok",
        extra={
            **logs.request_fields(result.request_id, result.user_id, result.model_version),
            **logs.record_fields(record.topic, record.partition, record.offset),
            "reply_topic": topic,
            "degraded": result.degraded,
            "reason": result.reason,
            "total_ms": result.timings_ms.get("total"),
        },
    )
