"""Plumbing shared by ``streamrank replay``, ``demo`` and the benchmarks: a stack to run on, and a
published model version (workers are started by :mod:`workbench.devstack.processes`).

Each helper stops exactly what it started (never a process or a stack it found running).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from streamrank.errors import StreamrankError
from streamrank.settings import Settings
from workbench.devstack.services import kafka_answers, redis_answers
from workbench.devstack.stack import EmbeddedStack


def stack_answers(settings: Settings) -> bool:
    """True when the broker and the Redis that ``settings`` name both answer."""
    return redis_answers(settings.redis.dsn) and kafka_answers(settings.kafka.bootstrap)


@contextlib.contextmanager
def stack_or_private(
    settings: Settings, *, run_dir: Path, say: Any = print
) -> Iterator[tuple[Settings, EmbeddedStack | None]]:
    """The stack ``settings`` point to when it answers; else a private embedded stack on free
    ports under ``run_dir`` (its Redis a local cluster when the settings name a cluster),
    stopped on exit. Yields the settings to use and the private stack."""
    if stack_answers(settings):
        yield settings, None
        return
    stack = EmbeddedStack.on_free_ports(run_dir, redis_cluster=settings.redis.is_cluster)
    say(
        f"nothing answers at {settings.kafka.bootstrap} / Redis; starting a private embedded "
        f"stack (kafka {stack.bootstrap}, redis {stack.redis_url})"
    )
    stack.up(timeout_s=120)
    try:
        yield stack.settings_for(settings).with_env(STREAMRANK_RUN_DIR=run_dir), stack
    finally:
        stack.down()


async def ensure_published(
    redis: Any, artifact: Any, *, encoding: str | None = None, progress: bool = True
) -> dict[str, Any]:
    """Publish ``artifact`` unless its version already is; returns ``{"version", "encoding",
    "published_now"}`` where ``encoding`` is the one its item table is stored in."""
    from scoring.model.registry import publish_artifact, published_config
    from streamrank import keys

    version = artifact.version
    if await redis.exists(keys.model_config(version)):
        config = await published_config(redis, version)
        stored = str(config["encoding"])
        if encoding is not None and encoding != stored:
            raise StreamrankError(
                f"version {version} is already published with encoding {stored}, not {encoding}; "
                f"drop --encoding or delete the version (`streamrank embeddings delete {version}`)"
            )
        return {"version": version, "encoding": stored, "published_now": False}
    report = await publish_artifact(redis, artifact, encoding=encoding, progress=progress)
    return {"version": version, "encoding": report["encoding"], "published_now": True}
