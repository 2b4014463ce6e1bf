import orjson
import pytest

from schemas import ClickEvent, Limits, decode_dead_letter
from streamrank.kafka_guard import UndecodableBatch
from streams import classify as classify_module
from streams.classify import Record, classify
from streams.windows import Window
from streams.writer import assemble

NOW = 1_800_000_000_000
WINDOWS = (Window("1h", 3600, 300), Window("24h", 86400, 3600))


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


def test_assemble_indexes_users_and_buckets_once() -> None:
    events = [
        ClickEvent("e1", "u1", "i1", NOW, "drama"),
        ClickEvent("e2", "u1", "i2", NOW + 1, None),
        ClickEvent("e3", "u2", "i1", NOW + 2, "comedy"),
    ]
    call = assemble(
        events,
        now_ms=NOW,
        windows=WINDOWS,
        lateness_s=600,
        sequence_length=50,
        sequence_ttl_s=100,
        dedupe_ttl_s=10,
    )
    payload = orjson.loads(call.payload)
    n_users, n_buckets = 2, 6  # u1 fine+coarse, u2 fine+coarse, items fine+coarse
    assert payload["n"] == [3, n_users, n_buckets]
    assert payload["h"] == [50, "100000", "10000"]
    assert call.keys[:3] == ["sr:seen:e1", "sr:seen:e2", "sr:seen:e3"]
    assert call.keys[3:5] == ["sr:seq:u1", "sr:seq:u2"]
    assert len(call.keys) == 3 + n_users + n_buckets
    first, second, third = payload["e"]
    assert first[:3] == [1, str(NOW), "e1\x1fi1\x1fdrama"]
    assert first[7:] == ["i1", "c:drama"]
    ufine, ucoarse, ifine, icoarse = first[3:7]
    fine_start = NOW // 1000 // 300 * 300
    coarse_start = NOW // 1000 // 3600 * 3600
    assert call.keys[5 + ufine - 1] == f"sr:cnt:u:u1:300:{fine_start}"
    assert call.keys[5 + ucoarse - 1] == f"sr:cnt:u:u1:3600:{coarse_start}"
    assert call.keys[5 + ifine - 1] == f"sr:cnt:i:300:{fine_start}"
    assert call.keys[5 + icoarse - 1] == f"sr:cnt:i:3600:{coarse_start}"
    assert payload["x"][ufine - 1] == str((fine_start + 300 + 3600 + 600) * 1000)
    assert payload["x"][ucoarse - 1] == str((coarse_start + 3600 + 86400 + 600) * 1000)
    assert second[0] == 1 and second[8] == ""  # same user, no category
    assert third[0] == 2 and third[6] == icoarse  # same item bucket shared across users
    assert call.too_old_for_counters == 0


def test_assemble_skips_counters_of_buckets_that_already_expired() -> None:
    old = NOW - 2 * 86400 * 1000
    hour_old = NOW - 2 * 3600 * 1000
    call = assemble(
        [ClickEvent("e1", "u1", "i1", old, None), ClickEvent("e2", "u1", "i1", hour_old, None)],
        now_ms=NOW,
        windows=WINDOWS,
        lateness_s=600,
        sequence_length=50,
        sequence_ttl_s=100,
        dedupe_ttl_s=10,
    )
    payload = orjson.loads(call.payload)
    first, second = payload["e"]
    assert first[3:7] == [0, 0, 0, 0]  # two days old: no window reaches it
    assert second[3] == 0 and second[5] == 0  # too old for 1 h
    assert second[4] > 0 and second[6] > 0  # still inside 24 h
    assert call.too_old_for_counters == 1
    assert payload["n"] == [2, 1, 2]
