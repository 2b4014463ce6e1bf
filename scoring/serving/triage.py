"""Decoding one batch of rank requests: what is to be ranked (with its reply topic and
deadline), and what is answered at once (an error reply, a dead letter)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import ConsumerRecord

from schemas import (
    DeadLetter,
    Limits,
    RankRequest,
    decode_request,
    peek_field,
    peek_request_id,
    reasons,
)
from scoring.serving import replies
from scoring.serving.metrics import ScoringMetrics
from scoring.serving.outgoing import Outgoing, ReplyWriter
from scoring.serving.service import Incoming
from streamrank.errors import UNDECODABLE_BATCH, ContractError, internal_error
from streamrank.kafka.guard import UndecodableBatch
from streamrank.runtime import logs
from streamrank.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Triaged:
    """One batch after decoding: requests to rank (with their records, reply topics and
    deadlines, all aligned) and what is answered without ranking."""

    valid: list[Incoming] = field(default_factory=list)
    records: list[ConsumerRecord[Any, Any]] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    deadlines: list[int] = field(default_factory=list)
    outgoing: list[Outgoing] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Routing:
    """Where replies and dead letters go, and the default deadline budgets."""

    results: str
    dead_letters: str
    allowed: tuple[str, ...]  # besides results
    budget_ms: int  # a request without its own deadline
    retrieval_budget_ms: int | None = None  # ... and without items (None: ``budget_ms``)

    @classmethod
    def from_settings(cls, settings: Settings) -> Routing:
        return cls(
            results=settings.topics.results,
            dead_letters=settings.topics.dead_letters,
            allowed=tuple(settings.topics.reply_allowed),
            budget_ms=settings.scoring.budget_ms,
            retrieval_budget_ms=settings.cascade.budget_ms,
        )

    def budget_for(self, request: RankRequest) -> int:
        """The default budget of ``request``: the cascade's for one that retrieves."""
        if request.retrieves and self.retrieval_budget_ms is not None:
            return self.retrieval_budget_ms
        return self.budget_ms

    def reply_topic(self, reply_to: str | None) -> str | None:
        return replies.reply_topic(reply_to, default=self.results, allowed=self.allowed)


class Triage:
    """Decodes records into requests; a bad one becomes a dead letter (and an error reply when
    its request_id can be read)."""

    def __init__(
        self, *, routing: Routing, limits: Limits, metrics: ScoringMetrics, writer: ReplyWriter
    ) -> None:
        self._routing = routing
        self._limits = limits
        self._metrics = metrics
        self._writer = writer

    def batch(self, records: Sequence[ConsumerRecord[Any, Any]], *, received: int) -> Triaged:
        out = Triaged()
        for record in records:
            try:
                request = self._decode(record)
                topic = self._routing.reply_topic(request.reply_to)
                if topic is None:
                    out.outgoing.append(self._refused_reply_to(record, request, received))
                    continue
                deadline = replies.deadline_ms(
                    request,
                    produced_ms=int(record.timestamp),
                    budget_ms=self._routing.budget_for(request),
                )
            except Exception as exc:
                # A contract breach, or a bug of ours on input nobody foresaw: only this record
                # is dead-lettered (and answered with an error when its request_id is readable).
                error = exc if isinstance(exc, ContractError) else internal_error(exc)
                out.outgoing.extend(self._reject(record, error, received))
                continue
            out.valid.append(Incoming(request, int(record.timestamp), received))
            out.records.append(record)
            out.topics.append(topic)
            out.deadlines.append(deadline)
        return out

    def _decode(self, record: ConsumerRecord[Any, Any]) -> RankRequest:
        if isinstance(record.value, UndecodableBatch):
            marker = record.value
            self._metrics.skipped_requests.inc(marker.last_offset - marker.first_offset + 1)
            raise ContractError(
                marker.describe(record.topic, record.partition), reason=UNDECODABLE_BATCH
            )
        return decode_request(record.value, self._limits)

    def _refused_reply_to(
        self, record: ConsumerRecord[Any, Any], request: RankRequest, received: int
    ) -> Outgoing:
        detail = f"reply_to {request.reply_to!r} is not in reply_topics_allowed"
        result = replies.error_reply(
            request.request_id,
            request.user_id,
            reasons.REPLY_TO_NOT_ALLOWED,
            detail,
            now_ms=received,
        )
        return self._writer.reply(self._routing.results, result, record)

    def _reject(
        self, record: ConsumerRecord[Any, Any], exc: ContractError, at: int
    ) -> list[Outgoing]:
        """A dead letter with the reason, and an error reply when the request_id is readable."""
        self._metrics.dead_letters.labels(exc.reason).inc()
        logger.info(
            "dead-lettering %s[%s]@%s: %s",
            record.topic,
            record.partition,
            record.offset,
            exc,
            extra={
                **logs.request_fields(
                    peek_request_id(record.value), peek_field(record.value, "user_id")
                ),
                **logs.record_fields(record.topic, record.partition, record.offset),
                "reason": exc.reason,
            },
        )
        letter = DeadLetter.rejected(record, exc, at=at)
        out = [Outgoing(self._routing.dead_letters, record.key or b"", letter.to_json())]
        if exc.reason == UNDECODABLE_BATCH:
            return out  # no request in it can be read, so no one to answer
        max_length = self._limits.max_id_length
        request_id = peek_request_id(record.value, max_length=max_length)
        if request_id is not None:
            result = replies.error_reply(
                request_id, "", reasons.INVALID_REQUEST, f"{exc.reason}: {exc}", now_ms=at
            )
            # The caller listens where it asked to be answered, when that topic is allowed.
            asked = peek_field(record.value, "reply_to", max_length=max_length)
            topic = self._routing.reply_topic(asked) or self._routing.results
            out.append(self._writer.reply(topic, result, record))
        return out
