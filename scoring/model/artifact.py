"""Versioned model artifacts: ``DIR/<version>/`` with safetensors weights and ``config.json``.

Layout of one artifact (never pickle: every tensor file is safetensors)::

    <version>/config.json            feature spec, model dims, default encoding, version id,
                                     training-data sha256, metrics, sha256 of every file below
    <version>/dense.safetensors      DIN's dense weights + small tables (``tables.category``)
    <version>/items.safetensors      ``item`` [rows, dim] float32 and ``oov`` [dim] float32
    <version>/item_ids.txt           the raw item id of each row, one per line (ids carry no
                                     control characters by contract)
    <version>/test_candidates.jsonl  the offline test lists with history and scores (replay)
    <version>/retrieval.safetensors  optional: the two-tower item vectors, categories, user tower
    <version>/index.faiss            optional: the ANN index over those vectors (faiss format)
    <version>/cascade_test.jsonl     optional: the offline cascade's top-10 per test user

:func:`load_artifact` validates everything (files present, checksums, dims, encoding, ids
unique, no NaN/Inf, weights load into the model) and raises :class:`ArtifactError` naming what
is wrong, so ``streamrank publish`` never writes half an artifact.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from scoring.embeddings.codec import ENCODINGS
from scoring.embeddings.validate import NAME_RE
from scoring.model.din import DenseWeights, ModelSpec
from scoring.model.retrieval import INDEX_FILE, RETRIEVAL_FILE, RetrievalFiles, Retriever
from scoring.model.scorer import DinScorer
from streamrank import keys
from streamrank.errors import ArtifactError

FORMAT = 1
CONFIG_FILE = "config.json"
DENSE_FILE = "dense.safetensors"
ITEMS_FILE = "items.safetensors"
IDS_FILE = "item_ids.txt"
CANDIDATES_FILE = "test_candidates.jsonl"
CASCADE_FILE = "cascade_test.jsonl"
# Same rule as the embedding store's names: letters, digits, '.', '_', '-' (no ':' or globs).
VERSION_RE = NAME_RE


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def new_version(kind: str = "din", *, now: datetime | None = None, content: bytes = b"") -> str:
    """A unique, readable version id, e.g. ``din-20261129-ab12cd`` (date + 6 hex of content+salt)."""
    now = now or datetime.now(UTC)
    digest = hashlib.sha256(content + now.isoformat().encode() + secrets.token_bytes(8)).hexdigest()
    return f"{kind}-{now:%Y%m%d}-{digest[:6]}"


@dataclass(frozen=True)
class Artifact:
    """A validated artifact, loaded in memory."""

    path: Path
    config: dict[str, Any]
    spec: ModelSpec
    dense: bytes  # safetensors bytes, as written to Redis on publish
    item_ids: list[str]
    item_table: npt.NDArray[np.float32]  # [rows, dim]
    oov_row: npt.NDArray[np.float32]  # [dim]
    retrieval: RetrievalFiles | None = None  # the retrieval model and its index, when trained

    @property
    def version(self) -> str:
        return str(self.config["version"])

    @property
    def encoding(self) -> str:
        return str(self.config["encoding"])

    def scorer(self, *, dense: DenseWeights = "fp32") -> DinScorer:
        """The serving scorer of these weights, served as fp32 or int8 (``dense``)."""
        return DinScorer.from_bytes(self.config, self.dense, weights=dense)

    def retriever(self) -> Retriever:
        """The version's retriever (ArtifactError when the artifact has no retrieval part)."""
        if self.retrieval is None:
            raise ArtifactError(f"artifact {self.path} has no retrieval model (trained without)")
        return Retriever.from_files(self.retrieval, self.item_ids)

    def config_bytes(
        self, *, encoding: str | None = None, chunks: Mapping[str, int] | None = None
    ) -> bytes:
        """config.json as published (``encoding`` = the one the item table was published in,
        ``chunks`` = how the retrieval files were cut into Redis values)."""
        config = dict(self.config)
        if encoding is not None:
            config["encoding"] = encoding
        if chunks is not None and "retrieval" in config:
            config["retrieval"] = {**config["retrieval"], "chunks": dict(chunks)}
        return json.dumps(config, indent=2, sort_keys=True).encode()


def save_artifact(
    out_dir: Path,
    *,
    spec: ModelSpec,
    dense_state: Mapping[str, torch.Tensor],
    item_ids: list[str],
    item_table: npt.NDArray[np.float32],
    oov_row: npt.NDArray[np.float32],
    encoding: str,
    feature_spec: dict[str, Any],
    data: dict[str, Any],
    metrics: dict[str, Any],
    train: dict[str, Any],
    version: str | None = None,
    retrieval: RetrievalFiles | None = None,
) -> Path:
    """Write ``out_dir/<version>/`` and return its path (the version id is in config.json)."""
    if encoding not in ENCODINGS:
        raise ArtifactError(f"unknown encoding {encoding!r}; use one of {', '.join(ENCODINGS)}")
    dense = st_save(dict(dense_state))
    table = np.ascontiguousarray(item_table, dtype=np.float32)
    items = st_save(
        {
            "item": torch.from_numpy(table),
            "oov": torch.from_numpy(np.ascontiguousarray(oov_row, dtype=np.float32)),
        }
    )
    ids = "".join(f"{i}\n" for i in item_ids).encode()
    version = version or new_version(spec.kind, content=dense)
    path = Path(out_dir) / version
    if path.exists():
        raise ArtifactError(f"artifact {path} already exists; versions are immutable")
    path.mkdir(parents=True)
    files = {
        "dense": {"name": DENSE_FILE, "sha256": sha256_bytes(dense)},
        "items": {"name": ITEMS_FILE, "sha256": sha256_bytes(items)},
        "item_ids": {"name": IDS_FILE, "sha256": sha256_bytes(ids)},
    }
    if retrieval is not None:
        files["retrieval"] = {"name": RETRIEVAL_FILE, "sha256": sha256_bytes(retrieval.weights)}
        files["index"] = {"name": INDEX_FILE, "sha256": sha256_bytes(retrieval.index)}
    config = {
        "format": FORMAT,
        "version": version,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": spec.to_json(),
        "feature_spec": feature_spec,
        "encoding": encoding,
        "item_table": {
            "table": keys.ITEM_TABLE,
            "rows": int(table.shape[0]),
            "dim": int(table.shape[1]),
        },
        "files": files,
        "data": data,
        "train": train,
        "metrics": metrics,
    }
    (path / DENSE_FILE).write_bytes(dense)
    (path / ITEMS_FILE).write_bytes(items)
    (path / IDS_FILE).write_bytes(ids)
    if retrieval is not None:
        config["retrieval"] = retrieval.config
        (path / RETRIEVAL_FILE).write_bytes(retrieval.weights)
        (path / INDEX_FILE).write_bytes(retrieval.index)
    # config.json last: a directory without it is visibly incomplete.
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    return path


def derive_artifact(
    artifact: Artifact,
    out_dir: Path,
    *,
    version: str,
    item_table: npt.NDArray[np.float32],
    note: str,
) -> Path:
    """A new version of ``artifact`` with another item table (same ids, dims and weights): a
    deliberately different model for experiments, e.g. shuffled rows. ``note`` is kept in
    config.json (``derived``); the test candidates are not copied (they belong to the
    original's training run)."""
    if item_table.shape != artifact.item_table.shape:
        raise ArtifactError(
            f"derived item table is {list(item_table.shape)}, the original's "
            f"{list(artifact.item_table.shape)}"
        )
    return save_artifact(
        out_dir,
        spec=artifact.spec,
        dense_state=st_load(artifact.dense),
        item_ids=list(artifact.item_ids),
        item_table=item_table,
        oov_row=artifact.oov_row,
        encoding=artifact.encoding,
        feature_spec=artifact.config.get("feature_spec", {}),
        data={
            **artifact.config.get("data", {}),
            "derived": {"from": artifact.version, "how": note},
        },
        metrics={},
        train=artifact.config.get("train", {}),
        version=version,
        retrieval=artifact.retrieval,
    )


def _read(path: Path, name: str, expected_sha: str | None) -> bytes:
    file = path / name
    if not file.is_file():
        raise ArtifactError(f"artifact {path}: missing file {name}")
    data = file.read_bytes()
    if expected_sha is not None and sha256_bytes(data) != expected_sha:
        raise ArtifactError(
            f"artifact {path}: {name} is corrupt (sha256 does not match config.json)"
        )
    return data


def _section(config: Mapping[str, Any], key: str, path: Path) -> Any:
    if key not in config:
        raise ArtifactError(f"artifact {path}: config.json lacks '{key}'")
    return config[key]


def resolve_artifact_path(ref: str | Path, artifacts_dir: Path | None = None) -> Path:
    """An artifact directory, or a version id under ``artifacts_dir``."""
    path = Path(ref)
    if not path.exists() and artifacts_dir is not None and (artifacts_dir / str(ref)).exists():
        path = artifacts_dir / str(ref)
    if not path.is_dir():
        raise ArtifactError(
            f"no artifact directory at {ref} (give DIR/<version> as written by train)"
        )
    return path


def load_artifact(ref: str | Path, *, artifacts_dir: Path | None = None) -> Artifact:
    """Load and validate an artifact; every inconsistency raises :class:`ArtifactError`."""
    path = resolve_artifact_path(ref, artifacts_dir)
    raw = _read(path, CONFIG_FILE, None)
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise ArtifactError(f"artifact {path}: config.json is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ArtifactError(f"artifact {path}: config.json must be a JSON object")
    if _section(config, "format", path) != FORMAT:
        raise ArtifactError(
            f"artifact {path}: format {config['format']!r} unsupported (expected {FORMAT})"
        )
    version = _section(config, "version", path)
    if not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        raise ArtifactError(f"artifact {path}: version {version!r} is not a valid id")
    encoding = _section(config, "encoding", path)
    if encoding not in ENCODINGS:
        raise ArtifactError(
            f"artifact {path}: unknown encoding {encoding!r} in config.json; use one of {', '.join(ENCODINGS)}"
        )
    spec = ModelSpec.from_json(_section(config, "model", path))
    files = _section(config, "files", path)
    table_meta = _section(config, "item_table", path)
    try:
        dense = _read(path, files["dense"]["name"], files["dense"]["sha256"])
        items_raw = _read(path, files["items"]["name"], files["items"]["sha256"])
        ids_raw = _read(path, files["item_ids"]["name"], files["item_ids"]["sha256"])
        rows, dim = int(table_meta["rows"]), int(table_meta["dim"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(
            f"artifact {path}: config.json 'files'/'item_table' malformed: {exc!r}"
        ) from exc
    try:
        tensors = st_load(items_raw)
    except Exception as exc:  # safetensors raises its own error types
        raise ArtifactError(
            f"artifact {path}: {ITEMS_FILE} is not valid safetensors: {exc}"
        ) from exc
    if "item" not in tensors or "oov" not in tensors:
        raise ArtifactError(f"artifact {path}: {ITEMS_FILE} must hold tensors 'item' and 'oov'")
    table = tensors["item"].numpy()
    oov = tensors["oov"].numpy()
    if table.dtype != np.float32 or table.shape != (rows, dim):
        raise ArtifactError(
            f"artifact {path}: item table is {table.dtype}{list(table.shape)}, config.json says "
            f"float32[{rows}, {dim}]"
        )
    if dim != spec.item_dim:
        raise ArtifactError(
            f"artifact {path}: item table dim {dim} != model item_dim {spec.item_dim}"
        )
    if oov.shape != (dim,):
        raise ArtifactError(
            f"artifact {path}: oov row has shape {list(oov.shape)}, expected [{dim}]"
        )
    bad = np.flatnonzero(~np.isfinite(table).all(axis=1))
    item_ids = ids_raw.decode("utf-8").split("\n")[:-1] if ids_raw else []
    if len(item_ids) != rows:
        raise ArtifactError(f"artifact {path}: {IDS_FILE} has {len(item_ids)} ids for {rows} rows")
    if bad.size:
        names = ", ".join(item_ids[i] for i in bad[:5])
        raise ArtifactError(f"artifact {path}: item table has NaN/Inf in rows of ids {names}")
    if not np.isfinite(oov).all():
        raise ArtifactError(f"artifact {path}: oov row has NaN/Inf")
    if len(set(item_ids)) != rows:
        raise ArtifactError(f"artifact {path}: {IDS_FILE} has duplicate ids")
    artifact = Artifact(path, config, spec, dense, item_ids, table, oov, _retrieval(path, config))
    artifact.scorer()  # the dense weights must load into the configured model
    if artifact.retrieval is not None:
        try:
            artifact.retriever()  # vectors, index and ids must agree
        except ArtifactError as exc:
            raise ArtifactError(f"artifact {path}: {exc}") from exc
    return artifact


def _retrieval(path: Path, config: Mapping[str, Any]) -> RetrievalFiles | None:
    """The artifact's retrieval part (checksums checked), or None when it has none."""
    section = config.get("retrieval")
    if section is None:
        return None
    files = config["files"]
    try:
        weights = _read(path, files["retrieval"]["name"], files["retrieval"]["sha256"])
        index = _read(path, files["index"]["name"], files["index"]["sha256"])
    except (KeyError, TypeError) as exc:
        raise ArtifactError(
            f"artifact {path}: config.json has a 'retrieval' section but 'files' lacks "
            f"retrieval/index: {exc!r}"
        ) from exc
    if not isinstance(section, dict):
        raise ArtifactError(f"artifact {path}: config.json 'retrieval' must be an object")
    return RetrievalFiles(config=section, weights=weights, index=index)
