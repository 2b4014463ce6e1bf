"""What describes a published embedding table, what a publish reports, and what a fetch returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from scoring.embeddings.codec import FloatMatrix, decode_blobs, decode_rows, row_bytes
from streamrank import keys
from streamrank.errors import EmbeddingError

FetchMode = Literal["script", "pipeline"]


@dataclass(frozen=True, slots=True)
class TableMeta:
    """What a reader needs to know about one published table."""

    version: str
    table: str
    dim: int
    encoding: str
    rows: int
    buckets: int
    shards: int  # buckets are grouped into this many shards (streamrank.keys.embedding_shard)
    oov_blob: bytes
    published_at: float
    publish_id: str

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.encoding, self.dim)

    def bucket_key(self, bucket: int) -> str:
        """The Redis key of one of the table's buckets."""
        return keys.embedding_bucket(self.version, self.table, bucket, self.shards)

    @property
    def oov_row(self) -> FloatMatrix:
        """The OOV row, decoded, ``float32[dim]``."""
        return decode_blobs([self.oov_blob], self.encoding, self.dim)[0]

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "table": self.table,
            "dim": self.dim,
            "encoding": self.encoding,
            "rows": self.rows,
            "buckets": self.buckets,
            "shards": self.shards,
            "row_bytes": self.row_bytes,
            "published_at": self.published_at,
            "publish_id": self.publish_id,
        }


@dataclass(frozen=True, slots=True)
class PublishReport:
    version: str
    table: str
    rows: int
    dim: int
    encoding: str
    buckets: int
    shards: int
    max_bucket_rows: int
    compact: bool
    seconds: float


@dataclass(frozen=True, slots=True)
class EncodedRows:
    """One fetch's result: ``blob`` holds ``len(found)`` encoded rows back to back (zeros where
    an id is unknown); ``found[i]`` says whether id ``i`` is in the table (base or overlay).
    ``overlay_id`` is the table's overlay id the fetch observed ("" when none), ``overlay[i]``
    whether row ``i`` came from the overlay (None: no row did)."""

    meta: TableMeta
    blob: bytes
    found: npt.NDArray[np.bool_]
    overlay_id: str = ""
    overlay: npt.NDArray[np.bool_] | None = None

    @property
    def generation(self) -> str:
        """What a cache labels these rows with: the publish id, plus the overlay id if any."""
        return generation(self.meta.publish_id, self.overlay_id)

    def decode(self) -> FloatMatrix:
        """``float32[n, dim]``, the table's OOV row where an id is unknown (one vectorised pass)."""
        meta = self.meta
        width = meta.row_bytes
        encoded = np.frombuffer(self.blob, dtype=np.uint8).reshape(-1, width)  # [n, row_bytes]
        out = decode_rows(encoded, meta.encoding, meta.dim)  # [n, dim]
        if not self.found.all():
            out[~self.found] = meta.oov_row
        return out


def generation(publish_id: str, overlay_id: str) -> str:
    """The label of a table's rows as of one publish and overlay: ``publish_id`` alone, or
    ``publish_id.overlay_id`` (both hex/decimal, so no ``\x1f``)."""
    return f"{publish_id}.{overlay_id}" if overlay_id else publish_id


def parse_meta(version: str, table: str, raw: dict[bytes, bytes]) -> TableMeta:
    try:
        return TableMeta(
            version=version,
            table=table,
            dim=int(raw[b"dim"]),
            encoding=raw[b"encoding"].decode(),
            rows=int(raw[b"rows"]),
            buckets=int(raw[b"buckets"]),
            shards=int(raw[b"shards"]),
            oov_blob=bytes(raw[b"oov"]),
            published_at=float(raw[b"published_at"]),
            publish_id=raw[b"publish_id"].decode(),
        )
    except (KeyError, ValueError) as exc:
        raise EmbeddingError(
            f"metadata of table {table!r} in version {version!r} is corrupt ({exc!r}); "
            f"delete the version (`streamrank embeddings delete {version}`) and publish it again"
        ) from exc
