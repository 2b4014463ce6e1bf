"""The serving pointers in Redis: ``sr:model:active`` (the version ``streamrank activate``
points at) and ``sr:model:split`` (an optional canary split). The scoring workers follow them
(:class:`scoring.serving.watcher.VersionWatcher`)."""

from __future__ import annotations

import redis.asyncio as aioredis

from scoring.model.canary import Split, parse_split
from streamrank import keys
from streamrank.errors import UnknownVersion


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


async def read_pointers(redis: aioredis.Redis) -> tuple[str | None, str | None]:
    """``(active version, split text)``, either None when unset (one MGET)."""
    pointer, split = await redis.mget([keys.active_model(), keys.model_split()])
    return _text(pointer), _text(split)


async def set_split(redis: aioredis.Redis, text: str | None) -> Split | None:
    """Write (or with None, clear) ``sr:model:split``; every version must be published."""
    if text is None:
        await redis.delete(keys.model_split())
        return None
    split = parse_split(text)
    published = await redis.smismember(keys.embedding_versions(), [v for v, _ in split])
    missing = [v for (v, _), ok in zip(split, published, strict=True) if not ok]
    if missing:
        raise UnknownVersion(
            f"version(s) {', '.join(missing)} are not published; run `streamrank publish` first"
        )
    await redis.set(keys.model_split(), ",".join(f"{v}:{w:g}" for v, w in split))
    return split
