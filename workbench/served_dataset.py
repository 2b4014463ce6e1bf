"""``streamrank dataset export``: the served log and the final outcomes, read end to end from
Kafka, joined into training samples (:mod:`scoring.training.served_data`) and written as
Parquet or JSON lines with a manifest beside the file; and reading such a file back.

The topics are read without a consumer group (partitions assigned, no offsets committed) from
the beginning up to the end offsets found at the start, so an export ends even while the
workers keep writing. The join is pure; this module is the reading and writing shell.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import orjson
from aiokafka import TopicPartition

from scoring.training.served_data import (
    COLUMNS,
    DatasetInfo,
    ServedSample,
    join_served,
    summary,
)
from streamrank.errors import ConfigError, StreamrankError
from streamrank.kafka import clients as kafka
from streamrank.kafka.guard import UndecodableBatch
from streamrank.settings import Settings

Format = Literal["parquet", "jsonl"]
FORMATS: tuple[Format, ...] = ("parquet", "jsonl")
MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_KIND = "streamrank-served-samples"
MANIFEST_FORMAT = 1


def _schema() -> Any:
    """The Parquet schema: one row per request, list columns aligned with ``items``."""
    import pyarrow as pa

    strings, ints = pa.list_(pa.string()), pa.list_(pa.int64())
    return pa.schema(
        [
            ("request_id", pa.string()), ("user_id", pa.string()),
            ("model_version", pa.string()), ("ts", pa.int64()), ("served_at", pa.int64()),
            ("history_items", strings), ("history_ts", ints), ("history_event_ids", strings),
            ("history_actions", strings), ("items", strings), ("ranks", pa.list_(pa.int32())),
            ("labels", pa.list_(pa.int8())), ("scores", pa.list_(pa.float64())),
            ("codes", ints), ("counters", pa.list_(ints)),
            ("cold_start", pa.map_(pa.string(), strings)),
        ]
    )  # fmt: skip


def format_of(path: Path, fmt: str | None = None) -> Format:
    """The file format: ``fmt``, else by the suffix (``.parquet``, ``.jsonl``)."""
    name = fmt or {".parquet": "parquet", ".jsonl": "jsonl"}.get(Path(path).suffix)
    if name not in FORMATS:
        raise ConfigError(
            f"{path}: cannot tell the format; name it .parquet or .jsonl, or pass --format"
        )
    return name


def write_samples(path: Path, samples: Sequence[ServedSample], fmt: Format) -> None:
    """Write the samples to ``path`` (through a temporary file, then renamed)."""
    tmp = Path(path).with_name(f".{Path(path).name}.tmp")
    rows = [s.to_row() for s in samples]
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), tmp, compression="zstd")
    else:
        with open(tmp, "wb") as fh:
            for row in rows:
                fh.write(orjson.dumps(row) + b"\n")
    os.replace(tmp, path)


def read_samples(path: Path, fmt: str | None = None) -> list[ServedSample]:
    """The samples of an exported file (Parquet or JSON lines), in file order."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no dataset file at {path} (write one with `streamrank dataset export`)")
    if format_of(path, fmt) == "parquet":
        import pyarrow.parquet as pq

        present = set(pq.read_schema(path).names)  # a file exported before cold_start existed
        columns = [c for c in COLUMNS if c != "cold_start" or c in present]
        rows = pq.read_table(path, columns=columns).to_pylist()
    else:
        with open(path, "rb") as fh:
            rows = [orjson.loads(line) for line in fh if line.strip()]
    return [ServedSample.from_row(r) for r in rows]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + MANIFEST_SUFFIX)


def write_manifest(
    path: Path, samples: Sequence[ServedSample], fmt: Format, **extra: Any
) -> dict[str, Any]:
    """The manifest beside the data file: its sha256 and size, rows, versions, time range."""
    found = summary(samples)
    manifest = {
        "kind": MANIFEST_KIND, "format": MANIFEST_FORMAT, "file": Path(path).name,
        "data_format": fmt, "sha256": sha256_file(path), "bytes": Path(path).stat().st_size,
        **found, "served_versions": sorted(found["versions"]),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"), **extra,
    }  # fmt: skip
    manifest_path(path).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def dataset_info(path: Path) -> DatasetInfo:
    """What a version trained on ``path`` records, from its manifest (checked against the file)."""
    found = manifest_path(path)
    if not found.is_file():
        raise ConfigError(f"{path}: no manifest {found.name} beside it (written by dataset export)")
    manifest = json.loads(found.read_text())
    if manifest.get("kind") != MANIFEST_KIND:
        raise ConfigError(f"{found}: not a served-samples manifest")
    digest = sha256_file(path)
    if digest != manifest.get("sha256"):
        raise ConfigError(
            f"{path}: sha256 {digest[:12]}… differs from its manifest's "
            f"{str(manifest.get('sha256'))[:12]}…: the file changed after the export"
        )
    return DatasetInfo(str(path), digest, int(manifest["rows"]), tuple(manifest["served_versions"]))


# --- reading the topics ----------------------------------------------------------------------


@dataclass
class ReadStats:
    records: dict[str, int] = field(default_factory=dict)  # per topic
    unreadable: dict[str, int] = field(default_factory=dict)  # not JSON objects, per topic


async def topic_sizes(
    settings: Settings, topics: Sequence[str]
) -> dict[TopicPartition, tuple[int, int]]:
    """(first, end) offsets of every partition of ``topics`` now."""
    consumer = kafka.consumer(settings.kafka, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps: list[TopicPartition] = []
        for topic in topics:
            known = consumer.partitions_for_topic(topic)
            if not known:
                await consumer._client.force_metadata_update()
                known = consumer.partitions_for_topic(topic)
            if not known:
                raise StreamrankError(
                    f"topic {topic!r} does not exist on {settings.kafka.bootstrap}: check "
                    "STREAMRANK_SERVED_LOG_TOPIC / STREAMRANK_OUTCOMES_TOPIC"
                )
            tps += [TopicPartition(topic, p) for p in sorted(known)]
        ends = await kafka.end_offsets(consumer, tps)
        begins = await consumer.beginning_offsets(tps)
        return {tp: (begins[tp], ends[tp]) for tp in tps}
    finally:
        await consumer.stop()


async def read_to_end(
    settings: Settings,
    sizes: dict[TopicPartition, tuple[int, int]],
    *,
    sink: Callable[[str, Any], None],
    progress: Callable[[int], Any] | None = None,
) -> None:
    """Hand every record's JSON value (None when unreadable) of each partition, from its first
    offset up to its end offset in ``sizes``, to ``sink(topic, value)``."""
    consumer = kafka.consumer(settings.kafka, group_id=None, enable_auto_commit=False,
                              fetch_max_wait_ms=100)  # fmt: skip
    await consumer.start()
    try:
        pending = [tp for tp, (begin, end) in sizes.items() if end > begin]
        consumer.assign(pending)
        for tp in pending:
            consumer.seek(tp, sizes[tp][0])
        while pending:
            batches = await consumer.getmany(*pending, timeout_ms=500)
            for tp, records in batches.items():
                kept = [r for r in records if r.offset < sizes[tp][1]]
                for record in kept:
                    sink(tp.topic, _value(record.value))
                if progress is not None and kept:
                    progress(len(kept))
            pending = [tp for tp in pending if await consumer.position(tp) < sizes[tp][1]]
    finally:
        await consumer.stop()


def _value(raw: Any) -> Any:
    if raw is None or isinstance(raw, UndecodableBatch):
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


async def export_dataset(
    settings: Settings,
    out: Path,
    *,
    fmt: Format,
    since_ms: int | None = None,
    until_ms: int | None = None,
    versions: Collection[str] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Read both topics, join, write ``out`` and its manifest; returns the manifest."""
    served_topic, outcomes_topic = settings.topics.served_log, settings.topics.outcomes
    if not served_topic or not outcomes_topic:
        raise ConfigError(
            "dataset export reads the served log and the final outcomes: set "
            "STREAMRANK_SERVED_LOG_TOPIC and STREAMRANK_OUTCOMES_TOPIC (the topics the scoring "
            "and outcomes workers write)"
        )
    from tqdm import tqdm

    sizes = await topic_sizes(settings, [served_topic, outcomes_topic])
    got: dict[str, list[Any]] = {served_topic: [], outcomes_topic: []}
    stats = ReadStats()

    def sink(topic: str, value: Any) -> None:
        stats.records[topic] = stats.records.get(topic, 0) + 1
        if value is None:
            stats.unreadable[topic] = stats.unreadable.get(topic, 0) + 1
        else:
            got[topic].append(value)

    total = sum(end - begin for begin, end in sizes.values())
    with tqdm(total=total, desc="read topics", unit="rec", disable=not progress) as bar:
        await read_to_end(settings, sizes, sink=sink, progress=bar.update)
    joined = join_served(got[served_topic], got[outcomes_topic], since_ms=since_ms,
                         until_ms=until_ms, versions=versions)  # fmt: skip
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_samples(out, joined.samples, fmt)
    return write_manifest(
        out, joined.samples, fmt,
        counts=joined.counts.to_json(),
        topics={"served_log": served_topic, "outcomes": outcomes_topic},
        read={"records": stats.records, "unreadable": stats.unreadable},
        filters={"since_ms": since_ms, "until_ms": until_ms,
                 "versions": sorted(versions) if versions is not None else None},
    )  # fmt: skip
