"""``streamrank dlq``: what is in the dead-letter topic, and putting it back.

Counting and listing read the topic like ``streamrank tail`` (no consumer group). ``--replay``
re-publishes the selected dead letters' original bytes and headers to their source topic, so a
producer bug, once fixed on our side (a decoder, a limit), can be repaired without code. A
replayed click is applied once (event_id dedupe) and a replayed request is answered again
(clients drop duplicate replies), so a replay that is run twice does no harm.

The key of a replayed record is the dead letter's own key (the scoring worker keys its dead
letters by the original key) or else the original payload's ``user_id`` (the contract's key of
clicks and requests), else none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas import DeadLetter, Limits, decode_dead_letter, peek_field
from streamrank.errors import ContractError, StreamrankError
from streamrank.kafka import clients as kafka
from streamrank.settings import Settings
from workbench.tail import Filters, Message, Start, TailStats, tail

_ANY_SIZE = Limits(max_message_bytes=1 << 30)  # a too_large letter is still a letter to us


@dataclass(frozen=True, slots=True)
class Letter:
    """A dead letter and where it sits in the dead-letter topic."""

    message: Message
    letter: DeadLetter

    def replay_key(self) -> bytes | None:
        if self.message.key:
            return self.message.key
        user = peek_field(self.letter.original_bytes(), "user_id")
        return user.encode() if user else None


async def read_letters(
    settings: Settings,
    *,
    start: Start,
    filters: Filters,
    source_topic: str | None = None,
    limit: int | None = None,
    stats: TailStats | None = None,
) -> tuple[list[Letter], int]:
    """The dead letters matching the filters (and source topic), and how many records of the
    topic were not readable dead letters."""
    found: list[Letter] = []
    unreadable = 0

    def keep(message: Message) -> None:
        nonlocal unreadable
        try:
            letter = decode_dead_letter(message.raw, _ANY_SIZE)
        except ContractError:
            unreadable += 1
            return
        if source_topic is None or letter.source_topic == source_topic:
            found.append(Letter(message, letter))

    await tail(
        settings, settings.topics.dead_letters, start=start, follow=False, limit=None,
        filters=filters, emit=keep, stats=stats or TailStats(),
    )  # fmt: skip
    return (found[:limit] if limit is not None else found), unreadable


def counts(letters: Sequence[Letter]) -> list[dict[str, Any]]:
    """Dead letters per (reason, source topic), most first."""
    tally = Counter((x.letter.reason, x.letter.source_topic) for x in letters)
    return [
        {"reason": reason, "source_topic": topic, "count": n}
        for (reason, topic), n in sorted(tally.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


async def replay(
    settings: Settings,
    letters: Sequence[Letter],
    *,
    confirm: bool,
    to_topic: str | None = None,
) -> dict[str, Any]:
    """Re-publish the letters' original bytes and headers (to ``to_topic`` or each letter's
    source topic); only when ``confirm``, else report what would be done."""
    plan = Counter(to_topic or x.letter.source_topic for x in letters)
    report: dict[str, Any] = {
        "selected": len(letters),
        "to": dict(sorted(plan.items())),
        "dry_run": not confirm,
        "replayed": 0,
    }
    if not confirm or not letters:
        return report
    producer = kafka.producer(settings.kafka, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(
                to_topic or x.letter.source_topic,
                x.letter.original_bytes(),
                key=x.replay_key(),
                headers=x.letter.original_headers() or None,
            )
            for x in letters
        ]
        for future in futures:
            await future
    except Exception as exc:
        raise StreamrankError(
            f"replay stopped after producing some of {len(letters)} dead letters ({exc}); "
            "running it again is safe (clicks are deduplicated, replies too)"
        ) from exc
    finally:
        await producer.stop()
    report["replayed"] = len(letters)
    return report
