import orjson
import pytest

from schemas import ClickEvent, Limits, decode_dead_letter
from streamrank.kafka.guard import UndecodableBatch
from streams import classify as classify_module
from streams.classify import Record, classify

NOW = 1_800_000_000_000


def rec(value: bytes | None, key: bytes | None = b"u1", offset: int = 0) -> Record:
    return Record("clicks", 2, offset, key, value)


def click(**kw: object) -> bytes:
    base = {"event_id": "e1", "user_id": "u1", "item_id": "i1", "ts": NOW, "category": "drama"}
    base.update(kw)
    return orjson.dumps(base)


def test_classify_sorts_valid_forwarded_and_dead() -> None:
    records = [
        rec(click(), offset=0),
        rec(click(event_id="e2", user_id="u2"), key=None, offset=1),  # unkeyed -> forward
        rec(click(event_id="e3", user_id="u3"), key=b"u1", offset=2),  # wrong key -> forward
        rec(b"not json", offset=3),
        rec(click(event_id="e4", ts=NOW - 8 * 86400 * 1000), offset=4),
        rec(click(event_id="e5", ts=NOW + 8 * 86400 * 1000), offset=5),
        rec(orjson.dumps({"event_id": "e6", "user_id": "u1"}), offset=6),
        rec(click(event_id="e7", item_id=7), offset=7),
        rec(b"x" * 70_000, offset=8),
        rec(None, offset=9),
        rec(click(), offset=10),  # same event_id as offset 0: applied once
    ]
    out = classify(records, limits=Limits(), now_ms=NOW, max_skew_s=7 * 86400)
    assert [e.event_id for e in out.apply] == ["e1"]
    assert [e.event_id for e in out.forward] == ["e2", "e3"]
    assert out.forward_raw[0] == records[1].value
    assert out.in_batch_duplicates == 1
    reasons = [reason for reason, _ in out.dead]
    assert reasons == [
        "not_json",
        "ts_out_of_range",
        "ts_out_of_range",
        "missing_field",
        "bad_type",
        "too_large",
        "empty",
    ]
    letter = out.dead[0][1]
    assert (letter.source_topic, letter.partition, letter.offset) == ("clicks", 2, 3)
    assert letter.original_bytes() == b"not json"
    assert letter.error.startswith("not_json: ")
    assert decode_dead_letter(letter.to_json()).offset == 3


def test_an_unexpected_exception_dead_letters_only_its_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = classify_module.decode_click

    def flaky(raw: bytes, limits: Limits) -> ClickEvent:
        if b"boom" in raw:
            raise RuntimeError("decoder bug\nsecond line")
        return real(raw, limits)

    monkeypatch.setattr(classify_module, "decode_click", flaky)
    headers = (("traceparent", b"00-abc-01"), ("bin", b"\xff"), ("none", None))
    records = [
        rec(click(), offset=0),
        Record("clicks", 2, 1, b"u1", click(event_id="e2", item_id="boom"), None, headers),
        rec(click(event_id="e3"), offset=2),
    ]
    out = classify(records, limits=Limits(), now_ms=NOW, max_skew_s=7 * 86400)
    assert [e.event_id for e in out.apply] == ["e1", "e3"]
    [(reason, letter)] = out.dead
    assert reason == "internal_error"
    assert letter.error == "internal_error: RuntimeError: decoder bug"
    assert letter.offset == 1 and letter.original_bytes() == records[1].value
    assert letter.original_headers() == list(headers)
    assert decode_dead_letter(letter.to_json()) == letter


def test_an_undecodable_batch_marker_becomes_one_dead_letter() -> None:
    marker = UndecodableBatch(b"", first_offset=10, last_offset=14, error="BadGzipFile: x")
    out = classify(
        [rec(marker, offset=14), rec(click(), offset=15)],
        limits=Limits(),
        now_ms=NOW,
        max_skew_s=7 * 86400,
    )
    assert [e.event_id for e in out.apply] == ["e1"]
    [(reason, letter)] = out.dead
    assert reason == "undecodable_batch" and out.skipped == 5
    assert "clicks[2] offsets 10-14 skipped" in letter.error and "BadGzipFile" in letter.error


def test_in_batch_duplicates_are_per_user_like_the_store_s_markers() -> None:
    """Two users' clicks that share an event_id are both applied (as they are when they come in
    two batches: the seen-markers are per user); one user's repeat is applied once."""
    records = [
        rec(click(event_id="e-\ufeff", user_id="u2"), key=b"u2", offset=0),
        rec(click(event_id="e-\ufeff", user_id="u1"), key=b"u1", offset=1),
        rec(click(event_id="e-\ufeff", user_id="u1", item_id="i9"), key=b"u1", offset=2),
    ]
    out = classify(records, limits=Limits(), now_ms=NOW, max_skew_s=7 * 86400)
    assert [(e.user_id, e.item_id) for e in out.apply] == [("u2", "i1"), ("u1", "i1")]
    assert out.applied_at == [("clicks", 2, 0), ("clicks", 2, 1)]
    assert out.in_batch_duplicates == 1
