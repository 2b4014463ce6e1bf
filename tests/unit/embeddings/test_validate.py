"""Publish input validation and small pure helpers of the embedding store (no Redis)."""

from __future__ import annotations

import numpy as np
import pytest

from scoring.embeddings.cache import top_k
from scoring.embeddings.validate import check_ids, check_matrix, check_name, check_oov_row
from streamrank.errors import EmbeddingError


def test_names() -> None:
    assert check_name("version", "din-2024.01_a") == "din-2024.01_a"
    for bad in ("", "a:b", "v*", "v?", "[v]", "-v", "x" * 65, "é"):
        with pytest.raises(EmbeddingError, match="invalid version name"):
            check_name("version", bad)
    with pytest.raises(EmbeddingError, match="reserved"):
        check_name("version", "versions")


def test_ids() -> None:
    assert check_ids(("a", "b")) == ["a", "b"]
    with pytest.raises(EmbeddingError, match=r"unique; 2 repeated: 'a', 'b'"):
        check_ids(["a", "b", "a", "c", "b"])
    with pytest.raises(EmbeddingError, match="non-empty strings"):
        check_ids(["a", ""])
    with pytest.raises(EmbeddingError, match="non-empty strings"):
        check_ids(["a", 3])  # type: ignore[list-item]
    with pytest.raises(EmbeddingError, match="control characters"):
        check_ids(["a", "b\x1fc"])


def test_matrix_checks_name_the_offending_ids() -> None:
    ids = [f"i{k}" for k in range(20)]
    m = np.ones((20, 4), dtype=np.float32)
    assert check_matrix(ids, m.astype(np.float64), "int8", 4).dtype == np.float32
    bad = m.copy()
    bad[3, 1] = np.nan
    bad[7, 0] = np.inf
    with pytest.raises(EmbeddingError, match=r"2 rows contain NaN or Inf.*'i3', 'i7'"):
        check_matrix(ids, bad, "fp32", None)
    huge = m.astype(np.float64)
    huge[5, 2] = 1e300  # finite in float64, Inf once cast to float32
    with pytest.raises(EmbeddingError, match="'i5'"):
        check_matrix(ids, huge, "fp32", None)
    over = m.copy()
    over[9, 0] = 70000.0
    with pytest.raises(EmbeddingError, match=r"fp16 range.*'i9'"):
        check_matrix(ids, over, "fp16", None)
    check_matrix(ids, over, "int8", None)  # int8 scales per row: fine
    with pytest.raises(EmbeddingError, match="dim is 4, expected 8"):
        check_matrix(ids, m, "int8", 8)
    with pytest.raises(EmbeddingError, match="20 rows but 19 ids"):
        check_matrix(ids[:19], m, "int8", None)
    with pytest.raises(EmbeddingError, match="dtype is int64"):
        check_matrix(ids, m.astype(np.int64), "int8", None)
    with pytest.raises(EmbeddingError, match="2-d"):
        check_matrix(ids, m.reshape(20, 2, 2), "int8", None)
    with pytest.raises(EmbeddingError, match="numpy array"):
        check_matrix(ids, m.tolist(), "int8", None)
    with pytest.raises(EmbeddingError, match="unknown encoding"):
        check_matrix(ids, m, "int4", None)
    with pytest.raises(EmbeddingError, match="no rows to publish"):
        check_matrix([], m[:0], "int8", None)


def test_oov_row() -> None:
    assert check_oov_row(None, 3).tolist() == [[0.0, 0.0, 0.0]]
    assert check_oov_row([1, 2, 3], 3).tolist() == [[1.0, 2.0, 3.0]]
    with pytest.raises(EmbeddingError, match="expected dim 3"):
        check_oov_row([1, 2], 3)
    with pytest.raises(EmbeddingError, match="NaN"):
        check_oov_row([1, np.nan, 3], 3)
    # fp16 would store inf for an out-of-range OOV row, like for a row
    with pytest.raises(EmbeddingError, match="oov_row exceeds the fp16 range"):
        check_oov_row([1.0, 7e4, 3.0], 3, "fp16")
    assert check_oov_row([1.0, 7e4, 3.0], 3, "int8").tolist() == [[1.0, 7e4, 3.0]]


def test_top_k() -> None:
    ids = ["a", "b", "c", "d"]
    assert top_k(ids, [1.0, 5.0, 3.0, 5.0], 3) == ["b", "d", "c"]
    assert top_k(ids, [1, 2, 3, 4], 0) == []
    assert top_k(ids, [1, 2, 3, 4], 10) == ["d", "c", "b", "a"]
    with pytest.raises(ValueError):
        top_k(ids, [1, 2], 1)
