"""Validation of what ``EmbeddingStore.publish`` is given: pure functions, no Redis."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from scoring.embeddings.codec import FloatMatrix, check_encoding
from streamrank.errors import EmbeddingError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_FP16_MAX = 65504.0
_SHOW = 10  # offending ids named in an error message


def check_name(kind: str, name: str) -> str:
    """A version or table name: letters, digits, ``.``, ``_``, ``-`` (so SCAN patterns are exact)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise EmbeddingError(
            f"invalid {kind} name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (no ':' or glob characters)"
        )
    if kind == "version" and name == "versions":
        raise EmbeddingError("'versions' is reserved (it names the set of versions); pick another")
    return name


def _name_ids(ids: Sequence[str], positions: npt.NDArray[np.int64]) -> str:
    shown = ", ".join(repr(ids[int(p)]) for p in positions[:_SHOW])
    more = f" and {len(positions) - _SHOW} more" if len(positions) > _SHOW else ""
    return shown + more


def check_ids(ids: Sequence[str]) -> list[str]:
    """Ids must be non-empty strings without control characters, and unique."""
    ids = list(ids)
    bad = [i for i, x in enumerate(ids) if not isinstance(x, str) or not x]
    if bad:
        raise EmbeddingError(
            f"ids must be non-empty strings; bad at positions {bad[:_SHOW]} (e.g. {ids[bad[0]]!r})"
        )
    if _CONTROL_RE.search("".join(ids)):
        offenders = [x for x in ids if _CONTROL_RE.search(x)]
        raise EmbeddingError(
            f"ids may not contain control characters: {', '.join(map(repr, offenders[:_SHOW]))}"
        )
    if len(set(ids)) != len(ids):
        dups = [x for x, n in Counter(ids).items() if n > 1]
        raise EmbeddingError(
            f"ids must be unique; {len(dups)} repeated: {', '.join(map(repr, dups[:_SHOW]))}"
        )
    return ids


def check_matrix(ids: Sequence[str], matrix: object, encoding: str, dim: int | None) -> FloatMatrix:
    """The matrix as C-contiguous float32 ``[len(ids), dim]``, or a clear EmbeddingError."""
    enc = check_encoding(encoding)
    if not isinstance(matrix, np.ndarray):
        raise EmbeddingError(f"matrix must be a numpy array, got {type(matrix).__name__}")
    if not np.issubdtype(matrix.dtype, np.floating):
        raise EmbeddingError(
            f"matrix dtype is {matrix.dtype}; pass float16/float32/float64 embeddings "
            "(cast integer or object arrays explicitly)"
        )
    if matrix.ndim != 2:
        raise EmbeddingError(f"matrix must be 2-d [rows, dim], got shape {matrix.shape}")
    rows, width = matrix.shape
    if rows != len(ids):
        raise EmbeddingError(f"matrix has {rows} rows but {len(ids)} ids were given")
    if rows == 0:
        raise EmbeddingError("no rows to publish (0 ids): a table needs at least one row")
    if width < 1:
        raise EmbeddingError("matrix has dim 0")
    if dim is not None and width != dim:
        raise EmbeddingError(f"matrix dim is {width}, expected {dim}")
    with np.errstate(over="ignore", invalid="ignore"):
        m32 = np.ascontiguousarray(matrix, dtype=np.float32)  # [rows, dim]
    bad = np.flatnonzero(~np.isfinite(m32).all(axis=1))
    if len(bad):
        raise EmbeddingError(
            f"{len(bad)} rows contain NaN or Inf (or overflow float32): ids {_name_ids(ids, bad)}"
        )
    if enc == "fp16":
        over = np.flatnonzero(np.abs(m32).max(axis=1) > _FP16_MAX)
        if len(over):
            raise EmbeddingError(
                f"{len(over)} rows exceed the fp16 range (|x| > 65504): ids {_name_ids(ids, over)}; "
                "use fp32 or int8, or rescale"
            )
    return m32


def check_oov_row(
    oov_row: npt.ArrayLike | None, dim: int, encoding: str | None = None
) -> FloatMatrix:
    """The OOV row as float32 ``[1, dim]``; zeros when not given. Same value rules as the rows."""
    if oov_row is None:
        return np.zeros((1, dim), dtype=np.float32)
    with np.errstate(over="ignore"):
        row = np.asarray(oov_row, dtype=np.float32).reshape(1, -1)  # [1, d]
    if row.shape[1] != dim:
        raise EmbeddingError(f"oov_row has {row.shape[1]} values, expected dim {dim}")
    if not np.isfinite(row).all():
        raise EmbeddingError("oov_row contains NaN or Inf (or overflows float32)")
    if encoding == "fp16" and np.abs(row).max() > _FP16_MAX:
        raise EmbeddingError("oov_row exceeds the fp16 range (|x| > 65504); use fp32 or int8")
    return row
