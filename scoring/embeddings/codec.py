"""Row encodings of the embedding store: fp32, fp16 and int8, encoded and decoded in bulk.

Byte layout of one encoded row (little-endian), ``dim`` values:

* ``fp32``: ``dim`` float32, ``4 * dim`` bytes.
* ``fp16``: ``dim`` float16, ``2 * dim`` bytes.
* ``int8``: one float32 scale, then ``dim`` int8 codes, ``4 + dim`` bytes;
  value = code * scale. Symmetric per-row quantisation (no offset): embedding rows are centred
  near zero, so an offset buys almost nothing in accuracy while symmetric decode is a single
  multiply and the row stays 4 bytes shorter. Worst-case error per value is ``scale / 2``, i.e.
  ``max|row| / 254``.

All functions work on whole batches with numpy: no per-row Python loop.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from streamrank.errors import EmbeddingError

Encoding = Literal["fp32", "fp16", "int8"]
ENCODINGS: tuple[str, ...] = get_args(Encoding)
_INT8_MAX = 127.0

FloatMatrix = npt.NDArray[np.float32]


def check_encoding(encoding: str) -> Encoding:
    if encoding not in ENCODINGS:
        raise EmbeddingError(f"unknown encoding {encoding!r}; use one of {', '.join(ENCODINGS)}")
    return encoding  # type: ignore[return-value]


def row_bytes(encoding: str, dim: int) -> int:
    """Size in bytes of one encoded row."""
    enc = check_encoding(encoding)
    return {"fp32": 4 * dim, "fp16": 2 * dim, "int8": 4 + dim}[enc]


def encode_rows(matrix: npt.ArrayLike, encoding: str) -> npt.NDArray[np.uint8]:
    """Encode a ``[n, dim]`` float matrix; returns ``[n, row_bytes]`` uint8 (row i = row i's bytes)."""
    enc = check_encoding(encoding)
    rows = np.ascontiguousarray(matrix, dtype=np.float32)  # [n, dim]
    if rows.ndim != 2:
        raise EmbeddingError(f"expected a 2-d matrix [rows, dim], got shape {rows.shape}")
    n = rows.shape[0]
    if enc == "fp32":
        return rows.astype("<f4").view(np.uint8).reshape(n, -1)
    if enc == "fp16":
        return rows.astype("<f2").view(np.uint8).reshape(n, -1)
    scale = np.abs(rows).max(axis=1) / _INT8_MAX  # [n]
    safe = np.where(scale > 0, scale, 1.0).astype(np.float32)  # [n]; all-zero rows keep scale 0
    codes = np.clip(np.rint(rows / safe[:, None]), -_INT8_MAX, _INT8_MAX).astype(
        np.int8
    )  # [n, dim]
    out = np.empty((n, 4 + rows.shape[1]), dtype=np.uint8)  # [n, 4 + dim]
    out[:, :4] = scale.astype("<f4").view(np.uint8).reshape(n, 4)
    out[:, 4:] = codes.view(np.uint8)
    return out


def decode_rows(encoded: npt.NDArray[np.uint8], encoding: str, dim: int) -> FloatMatrix:
    """Decode ``[n, row_bytes]`` uint8 back to ``[n, dim]`` float32."""
    enc = check_encoding(encoding)
    width = row_bytes(enc, dim)
    buf = np.ascontiguousarray(encoded, dtype=np.uint8).reshape(-1, width)  # [n, width]
    if enc == "fp32":
        return buf.view("<f4").astype(np.float32, copy=True)
    if enc == "fp16":
        return buf.view("<f2").astype(np.float32)
    scale = np.ascontiguousarray(buf[:, :4]).view("<f4")  # [n, 1]
    codes = buf[:, 4:].view(np.int8)  # [n, dim]
    return codes.astype(np.float32) * scale


def decode_blobs(blobs: list[bytes], encoding: str, dim: int) -> FloatMatrix:
    """Decode a list of encoded rows (as fetched from Redis) in one vectorised pass."""
    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)
    width = row_bytes(encoding, dim)
    joined = b"".join(blobs)
    if len(joined) != width * len(blobs):
        raise EmbeddingError(
            f"encoded rows have the wrong size for {encoding} at dim {dim} (expected {width} bytes "
            "each); the table's metadata and rows disagree: republish the version"
        )
    return decode_rows(np.frombuffer(joined, dtype=np.uint8), encoding, dim)


def roundtrip(matrix: npt.ArrayLike, encoding: str) -> FloatMatrix:
    """What a matrix looks like after a trip through the store (for offline evaluation)."""
    rows = np.asarray(matrix, dtype=np.float32)
    return decode_rows(encode_rows(rows, encoding), encoding, rows.shape[1])


def max_abs_error(matrix: npt.ArrayLike, encoding: str) -> npt.NDArray[np.float32]:
    """Per-row bound on |decoded - original| for each encoding (what the tests check against)."""
    rows = np.asarray(matrix, dtype=np.float32)
    peak = np.abs(rows).max(axis=1)  # [n]
    if encoding == "fp32":
        return np.zeros_like(peak)
    if encoding == "fp16":
        return (peak * 2.0**-11 + 6e-8).astype(np.float32)  # half an fp16 ulp, plus subnormal floor
    return (peak / (2 * _INT8_MAX) * 1.0001 + 1e-12).astype(np.float32)
