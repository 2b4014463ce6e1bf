"""Publishing model versions to Redis, activating one, and loading a scorer back from Redis.

``publish``: validate the whole artifact first (:func:`scoring.model.artifact.load_artifact`), then the
item table goes into the embedding store (table ``item``; the store writes its meta last), then the
retrieval model and its ANN index (in chunks of :data:`CHUNK_BYTES`), the dense weights, and
config.json LAST. A version counts as published only once its config key
exists, so a crash part-way leaves nothing a reader or ``activate`` would accept; running
``publish`` again completes it (an item table already in the store with the same rows, dim and
encoding is kept).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis

from scoring.embeddings.codec import ENCODINGS
from scoring.embeddings.store import EmbeddingStore
from scoring.embeddings.validate import check_name
from scoring.model.artifact import Artifact
from scoring.model.canary import parse_split
from scoring.model.din import DenseWeights, ModelSpec, features_of
from scoring.model.features import check_servable
from scoring.model.onnx_graph import export_graph
from scoring.model.retrieval import RetrievalFiles, Retriever
from scoring.model.runtimes import ForwardRuntime
from scoring.model.scorer import DinScorer
from streamrank import keys
from streamrank.errors import ArtifactError, EmbeddingError, RuntimeUnavailable, UnknownVersion
from streamrank.redis.client import unlink_matching
from streamrank.redis.errors import redis_call
from streamrank.settings import FeatureSettings

logger = logging.getLogger(__name__)

CHUNK_BYTES = 4 * 1024 * 1024  # one Redis value per few MB: no value of hundreds of MB
CHUNKS_PER_CALL = 8  # chunks per pipeline or MGET
CHUNKED = {"retrieval": keys.retrieval_chunk, "index": keys.index_chunk}


async def publish_artifact(
    redis: aioredis.Redis, artifact: Artifact, *, encoding: str | None = None, progress: bool = True
) -> dict[str, Any]:
    """Publish a validated artifact under its version; returns a small report."""
    enc = encoding or artifact.encoding
    if enc not in ENCODINGS:
        raise ArtifactError(f"unknown encoding {enc!r}; use one of {', '.join(ENCODINGS)}")
    version = artifact.version
    if await redis.exists(keys.model_config(version)):
        raise ArtifactError(
            f"version {version!r} is already published (versions are immutable); train a new version"
        )
    store = EmbeddingStore(redis=redis)
    rows, dim = artifact.item_table.shape
    table_report: dict[str, Any]
    try:
        meta = await store.table_meta(version, keys.ITEM_TABLE)
    except UnknownVersion:
        report = await store.publish(
            keys.ITEM_TABLE,
            artifact.item_ids,
            artifact.item_table,
            encoding=enc,
            version=version,
            oov_row=artifact.oov_row,
            progress=progress,
        )
        table_report = {"rows": report.rows, "dim": report.dim, "encoding": report.encoding,
                        "seconds": round(report.seconds, 3), "resumed": False}  # fmt: skip
    else:
        # An earlier publish stored the table but died before the model keys: finish it.
        if (meta.rows, meta.dim, meta.encoding) != (rows, dim, enc):
            raise ArtifactError(
                f"version {version!r} already has an item table with rows/dim/encoding "
                f"{meta.rows}/{meta.dim}/{meta.encoding}, this artifact has {rows}/{dim}/{enc}; "
                f"delete that version (`streamrank embeddings delete {version}`) or publish "
                "with the same encoding"
            )
        table_report = {
            "rows": meta.rows,
            "dim": meta.dim,
            "encoding": meta.encoding,
            "resumed": True,
        }
    chunks = None
    if artifact.retrieval is not None:
        chunks = await _publish_retrieval(redis, version, artifact.retrieval)
    graph = await asyncio.to_thread(_onnx_graph, artifact)
    pipe = redis.pipeline(transaction=False)
    pipe.set(keys.model_dense(version), artifact.dense)
    if graph is not None:
        pipe.set(keys.model_graph(version), graph)
    pipe.set(keys.model_config(version), artifact.config_bytes(encoding=enc, chunks=chunks))  # last
    await pipe.execute()
    logger.info("published %s (%s rows, %s)", version, rows, enc)
    out: dict[str, Any] = {"version": version, "encoding": enc, "item_table": table_report,
                           "dense_bytes": len(artifact.dense),
                           "onnx_graph_bytes": len(graph) if graph else None}  # fmt: skip
    if artifact.retrieval is not None and chunks is not None:
        index = artifact.retrieval.config.get("index", {})
        out["retrieval"] = {"index": index.get("kind"), "index_bytes": len(artifact.retrieval.index),
                               "weights_bytes": len(artifact.retrieval.weights), "chunks": chunks}  # fmt: skip
    return out


def _onnx_graph(artifact: Artifact) -> bytes | None:
    """The forward's ONNX graph (for workers serving with the onnx runtime); None without the
    exporter (``streamrank[onnx]``)."""
    try:
        return export_graph(artifact.scorer().pair)
    except RuntimeUnavailable as exc:
        logger.info("published without an ONNX graph (%s)", exc)
        return None


def _cut(data: bytes) -> list[bytes]:
    return [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]


async def _publish_retrieval(
    redis: aioredis.Redis, version: str, files: RetrievalFiles
) -> dict[str, int]:
    """Write the retrieval model and index chunks; returns the chunk counts for the config."""
    counts: dict[str, int] = {"bytes": CHUNK_BYTES}
    for what, data in (("retrieval", files.weights), ("index", files.index)):
        parts = _cut(data)
        for start in range(0, len(parts), CHUNKS_PER_CALL):
            pipe = redis.pipeline(transaction=False)
            for n, part in enumerate(parts[start : start + CHUNKS_PER_CALL], start=start):
                pipe.set(CHUNKED[what](version, n), part)
            await pipe.execute()
        counts[what] = len(parts)
    return counts


async def load_retriever_from_redis(
    redis: aioredis.Redis, version: str, config: Mapping[str, Any]
) -> Retriever | None:
    """The retriever of a published version (``config``: its config.json), or None when the
    version has no retrieval model. A missing or corrupt chunk, or files that do not agree, is
    an :class:`ArtifactError` naming the version and what to do."""
    section = config.get("retrieval")
    if section is None:
        return None
    redo = (f"delete the version (`streamrank embeddings delete {version}`) and publish it "
            "again, or activate a version with a retrieval model")  # fmt: skip
    blobs: dict[str, bytes] = {}
    try:
        for what in CHUNKED:
            blobs[what] = await _read_chunks(redis, version, what, int(section["chunks"][what]))
            expected = config["files"][what]["sha256"]
            if hashlib.sha256(blobs[what]).hexdigest() != expected:
                raise ArtifactError(
                    f"the {what} chunks of model version {version!r} in Redis are corrupt "
                    f"(sha256 differs from its config); {redo}"
                )
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(
            f"the published config of model version {version!r} lacks the retrieval chunk "
            f"counts or checksums ({exc!r}); {redo}"
        ) from exc
    files = RetrievalFiles(config=section, weights=blobs["retrieval"], index=blobs["index"])
    try:
        # deserialising the index of a large catalogue takes a while: off the event loop
        return await asyncio.to_thread(Retriever.from_files, files)
    except ArtifactError as exc:
        raise ArtifactError(f"model version {version!r}: {exc}; {redo}") from exc


async def _read_chunks(redis: aioredis.Redis, version: str, what: str, count: int) -> bytes:
    parts: list[bytes] = []
    for start in range(0, count, CHUNKS_PER_CALL):
        names = [
            CHUNKED[what](version, n) for n in range(start, min(start + CHUNKS_PER_CALL, count))
        ]
        for name, value in zip(names, await redis.mget(names), strict=True):
            if value is None:
                raise ArtifactError(
                    f"model version {version!r}: {name} is missing in Redis; delete the version "
                    f"(`streamrank embeddings delete {version}`) and publish it again"
                )
            parts.append(value if isinstance(value, bytes) else value.encode())
    return b"".join(parts)


def _parse_config(raw: bytes | str, version: str) -> dict[str, Any]:
    """A published config.json, or ArtifactError (a StreamrankError the scorer's reload handles)."""
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise ArtifactError(
            f"the published config of model version {version!r} is not valid JSON ({exc}); "
            f"delete the version (`streamrank embeddings delete {version}`) and publish it again"
        ) from exc
    if not isinstance(config, dict):
        raise ArtifactError(
            f"the published config of model version {version!r} is not a JSON object; "
            f"delete the version (`streamrank embeddings delete {version}`) and publish it again"
        )
    return config


async def published_config(redis: aioredis.Redis, version: str) -> dict[str, Any]:
    """The config.json of a published version; UnknownVersion when it is not published."""
    raw = await redis.get(keys.model_config(version))
    if raw is None:
        raise UnknownVersion(
            f"model version {version!r} is not published; run `streamrank publish ARTIFACT` first"
        )
    return _parse_config(raw, version)


async def activate_version(
    redis: aioredis.Redis, version: str, *, features: FeatureSettings | None = None
) -> str | None:
    """Point ``sr:model:active`` at a fully published version; returns the previous one.
    With ``features`` (the workers' feature settings), a version whose feature spec they cannot
    serve is refused (ArtifactError naming the input)."""
    config = await published_config(redis, version)
    if features is not None:
        spec = ModelSpec.from_json(config.get("model", {}))
        check_servable(features_of(config, spec), features)
    await EmbeddingStore(redis=redis).table_meta(
        version, keys.ITEM_TABLE
    )  # UnknownVersion if absent
    previous = await redis.set(keys.active_model(), version, get=True)  # SET ... GET: Redis >= 6.2
    return previous.decode() if isinstance(previous, bytes) else None


async def active_version(redis: aioredis.Redis) -> str | None:
    raw = await redis.get(keys.active_model())
    return raw.decode() if isinstance(raw, bytes) else raw


async def load_scorer_from_redis(
    redis: aioredis.Redis,
    version: str,
    *,
    dense: DenseWeights = "fp32",
    runtime: ForwardRuntime = "eager",
    threads: int = 1,
) -> tuple[DinScorer, dict[str, Any]]:
    """The serving scorer (dense weights served as ``dense``, the forward on ``runtime``) and
    config of a published version, from Redis alone (one round trip). The scorer is built (and
    compiled) on a thread of its own: the event loop goes on meanwhile."""
    config_raw, dense_raw, graph = await redis.mget(
        [keys.model_config(version), keys.model_dense(version), keys.model_graph(version)]
    )
    if config_raw is None or dense_raw is None:
        raise UnknownVersion(
            f"model version {version!r} is not (fully) published; run `streamrank publish` for it"
        )
    config = _parse_config(config_raw, version)
    weights = dense_raw if isinstance(dense_raw, bytes) else dense_raw.encode()
    scorer = await asyncio.to_thread(
        DinScorer.from_bytes, config, weights, weights=dense, runtime=runtime,
        graph=graph if runtime == "onnx" and isinstance(graph, bytes) else None, threads=threads,
    )  # fmt: skip
    return scorer, config


async def delete_version(store: EmbeddingStore, version: str, *, force: bool = False) -> int:
    """Delete every key of ``version``: its model keys (config first: without it a version no
    longer counts as published, so neither ``activate`` nor a scoring worker picks it up while
    its rows disappear), then its embedding tables. Returns the keys deleted.

    Refuses a version the scoring workers may serve, the active one (``sr:model:active``) or one
    in the canary split (``sr:model:split``), unless ``force``.
    """
    check_name("version", version)
    redis = store.redis
    with redis_call(
        f"while deleting version {version!r}",
        "run the delete again (it resumes: every step is idempotent)",
    ):
        active, split = await redis.mget([keys.active_model(), keys.model_split()])
        if active is not None and _text(active) == version and not force:
            raise EmbeddingError(
                f"version {version!r} is the active model version; activate another first "
                "(or pass force)"
            )
        if split is not None and version in {v for v, _ in parse_split(_text(split))} and not force:
            raise EmbeddingError(
                f"version {version!r} is in the canary split {keys.model_split()} "
                f"({_text(split)!r}); take it out of the split first (or pass force)"
            )
        deleted = int(
            await redis.unlink(
                keys.model_config(version), keys.model_dense(version), keys.model_graph(version)
            )
        )
        for what in CHUNKED:
            deleted += await unlink_matching(redis, keys.model_chunks_pattern(version, what))
        known, table_keys = await store.delete_version_keys(version)
    if not known and deleted + table_keys == 0:
        raise UnknownVersion(f"embedding version {version!r} is not published; nothing deleted")
    return deleted + table_keys


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
