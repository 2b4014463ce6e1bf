"""The overlay's pure parts: row decoding with reason codes, JSON-lines files, generations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from scoring.embeddings.meta import generation
from scoring.embeddings.overlay import decode_row, read_jsonl
from streamrank.errors import ContractError, EmbeddingError


def test_decode_row_returns_id_and_float32_vector() -> None:
    item, row = decode_row(
        b'{"id": "m7", "vector": [1, -0.5, 2.25], "extra": 1}', dim=3, encoding="int8"
    )
    assert item == "m7"
    assert row.dtype == np.float32 and row.tolist() == [1.0, -0.5, 2.25]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "not_json"),
        (b"[1, 2]", "not_object"),
        (b'{"vector": [1, 2]}', "missing_field"),
        (b'{"id": "a"}', "missing_field"),
        (b'{"id": 5, "vector": [1, 2]}', "bad_type"),
        (b'{"id": "", "vector": [1, 2]}', "bad_value"),
        (b'{"id": "a\\u001fb", "vector": [1, 2]}', "bad_value"),
        (b'{"id": "a", "vector": "1,2"}', "bad_type"),
        (b'{"id": "a", "vector": [1, true]}', "bad_type"),
        (b'{"id": "a", "vector": [1, 2, 3]}', "bad_dim"),
        (b'{"id": "a", "vector": [1, 1e39]}', "out_of_range"),
    ],
)
def test_decode_row_refuses_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(ContractError) as err:
        decode_row(raw, dim=2, encoding="int8")
    assert err.value.reason == reason


def test_decode_row_checks_the_codec_range_and_id_length() -> None:
    with pytest.raises(ContractError) as err:
        decode_row(b'{"id": "a", "vector": [70000.0, 0]}', dim=2, encoding="fp16")
    assert err.value.reason == "out_of_range"
    assert decode_row(b'{"id": "a", "vector": [70000.0, 0]}', dim=2, encoding="int8")[0] == "a"
    with pytest.raises(ContractError, match="1-4 characters"):
        decode_row(b'{"id": "abcde", "vector": [1, 0]}', dim=2, encoding="int8", max_id_length=4)


def test_non_finite_numbers_are_refused() -> None:
    # orjson refuses NaN/Infinity literals; a JSON number too large for float64 is Infinity.
    with pytest.raises(ContractError) as err:
        decode_row(b'{"id": "a", "vector": [1e400, 0]}', dim=2, encoding="fp32")
    assert err.value.reason in ("not_json", "not_finite")


def test_read_jsonl_last_row_of_an_id_wins(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    lines = [
        {"id": "a", "vector": [1.0, 2.0]},
        {"id": "b", "vector": [3.0, 4.0]},
        {"id": "a", "vector": [5.0, 6.0]},
    ]
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n\n")
    ids, matrix = read_jsonl(str(path), dim=2, encoding="int8")
    assert ids == ["a", "b"]
    assert matrix.tolist() == [[5.0, 6.0], [3.0, 4.0]]


def test_read_jsonl_names_every_bad_line_and_refuses_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "a", "vector": [1, 2]}\n{"id": "b", "vector": [1]}\nnope\n')
    with pytest.raises(EmbeddingError) as err:
        read_jsonl(str(path), dim=2, encoding="int8")
    text = str(err.value)
    assert "2 bad rows, nothing written" in text
    assert "line 2: bad_dim" in text and "line 3: not_json" in text
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(EmbeddingError, match="no rows"):
        read_jsonl(str(empty), dim=2, encoding="int8")


def test_generation_labels_a_publish_and_its_overlay() -> None:
    assert generation("abc", "") == "abc"
    assert generation("abc", "000000000003") == "abc.000000000003"
    assert "\x1f" not in generation("abc", "000000000003")
