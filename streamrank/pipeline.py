"""Plumbing shared by ``streamrank replay`` and ``streamrank demo``: a stack to run on, a published
model version, and the two worker kinds as child processes.

Each helper stops exactly what it started (never a process or a stack it found running).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from streamrank.errors import StreamrankError
from streamrank.settings import Settings
from streamrank.stack import EmbeddedStack, free_port, kafka_answers, redis_answers
from streams.launch import WorkerHandle

SCORING_READY = "scoring worker consuming"  # logged by ScoringWorker.start once it consumes
FEATURES_READY = "Worker ready"  # logged by Faust once the features worker is assigned


def stack_answers(settings: Settings) -> bool:
    """True when the broker and the Redis that ``settings`` name both answer."""
    return redis_answers(settings.redis_dsn) and kafka_answers(settings.kafka_bootstrap)


@contextlib.contextmanager
def stack_or_private(
    settings: Settings, *, run_dir: Path, say: Any = print
) -> Iterator[tuple[Settings, EmbeddedStack | None]]:
    """The stack ``settings`` point to when it answers; else a private embedded stack on free
    ports under ``run_dir``, stopped on exit. Yields the settings to use and the private stack."""
    if stack_answers(settings):
        yield settings, None
        return
    stack = EmbeddedStack(run_dir=run_dir, kafka_port=free_port(), redis_port=free_port())
    say(
        f"nothing answers at {settings.kafka_bootstrap} / Redis; starting a private embedded "
        f"stack (kafka {stack.bootstrap}, redis {stack.redis_url})"
    )
    stack.up(timeout_s=60)
    try:
        yield (
            settings.model_copy(
                update={
                    "kafka_bootstrap": stack.bootstrap,
                    "redis_url": SecretStr(stack.redis_url),
                    "run_dir": run_dir,
                }
            ),
            stack,
        )
    finally:
        stack.down()


def start_worker(
    kind: str,
    settings: Settings,
    *,
    log_path: Path,
    metrics_port: int = 0,
    extra_env: dict[str, str] | None = None,
) -> WorkerHandle:
    """Start ``streamrank worker KIND`` (features or scoring) with every field of ``settings``
    handed over through the environment; its output goes to ``log_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")}
    env.update(settings.as_env())
    if settings.log_level.upper() not in ("DEBUG", "INFO"):
        env["STREAMRANK_LOG_LEVEL"] = "INFO"  # the ready markers are INFO lines
    env.update(extra_env or {})
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    argv = [sys.executable, "-m", "streamrank.cli", "worker", kind]
    argv += ["--metrics-port", str(metrics_port)]
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
    )
    return WorkerHandle(process, log_path, log)


def wait_logged(handle: WorkerHandle, marker: str, *, what: str, timeout_s: float) -> None:
    """Wait until the worker's log shows ``marker``; a clear error if it exits or stays silent."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if marker in handle.log_text():
            return
        if not handle.alive():
            raise StreamrankError(
                f"the {what} (pid {handle.pid}) exited during start-up; its log "
                f"{handle.log_path} ends with:\n{handle.log_text()[-3000:]}"
            )
        time.sleep(0.1)
    raise StreamrankError(
        f"the {what} (pid {handle.pid}) was not ready after {timeout_s:.0f}s; see {handle.log_path}"
    )


async def ensure_published(
    redis: Any, artifact: Any, *, encoding: str | None = None, progress: bool = True
) -> dict[str, Any]:
    """Publish ``artifact`` unless its version already is; returns ``{"version", "encoding",
    "published_now"}`` where ``encoding`` is the one its item table is stored in."""
    from scoring.registry import publish_artifact, published_config
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
