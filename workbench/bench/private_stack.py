"""A benchmark's own work directory and its private embedded stack (Tansu + Redis on free
ports), for benchmarks that move the serving pointers or need a clean broker and Redis."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from streamrank.settings import Settings


def work_dir(settings: Settings, name: str) -> Path:
    """A fresh folder for one run of benchmark ``name`` under the run directory."""
    run_dir = Path(settings.tools.run_dir)
    parent = run_dir.resolve() if run_dir.exists() else None
    return Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=parent))


def on_private_stack(
    settings: Settings,
    work: Path,
    bench: Callable[[Settings], Coroutine[Any, Any, dict[str, Any]]],
    *,
    name: str,
) -> dict[str, Any]:
    """Run ``bench(settings)`` against an embedded stack of its own, always taken down."""
    from pydantic import SecretStr

    from workbench.devstack.services import free_port
    from workbench.devstack.stack import EmbeddedStack

    stack = EmbeddedStack(run_dir=work / "stack", kafka_port=free_port(), redis_port=free_port())
    print(f"bench {name}: private embedded stack (kafka {stack.bootstrap}, redis "
          f"{stack.redis_url}); work in {work}", file=sys.stderr, flush=True)  # fmt: skip
    stack.up(timeout_s=60)
    try:
        private = settings.with_env(
            STREAMRANK_KAFKA_BOOTSTRAP=stack.bootstrap,
            STREAMRANK_REDIS_URL=SecretStr(stack.redis_url),
            STREAMRANK_RUN_DIR=work,
        )
        return asyncio.run(bench(private))
    finally:
        stack.down()
