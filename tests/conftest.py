"""Shared fixtures: the embedded stack (session-wide) and per-test settings on it.

Unit tests (tests/unit) need none of this. Integration tests (tests/integration) get a real
Tansu broker and a real Redis, started once per session on free ports, or the ones named by
``STREAMRANK_TEST_KAFKA_BOOTSTRAP`` and ``STREAMRANK_TEST_REDIS_URL`` when both are set.
``STREAMRANK_TEST_REDIS=cluster`` makes that Redis a local Redis Cluster (3 masters, 3
replicas); a ``redis+cluster://`` ``STREAMRANK_TEST_REDIS_URL`` names an external cluster.
``make test`` runs every test on a single Redis, then the tests marked ``cluster`` (their
behaviour depends on key placement, hash slots, scripts, pipelines or the cluster client) on
the cluster; ``make test-cluster`` runs every integration test there. Tests that only make
sense on one server (they stop and start a private redis-server) carry
``@pytest.mark.standalone_only``; ``cluster_only`` implies ``cluster``.

Under pytest-xdist each worker process gets a stack of its own (this fixture runs once per
worker), so tests that share the stack's global keys never meet.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from streamrank.settings import Settings


@dataclass(frozen=True)
class StackInfo:
    bootstrap: str
    redis_url: str
    run_dir: Path

    @property
    def redis_cluster(self) -> bool:
        return self.redis_url.partition("://")[0].endswith("+cluster")

    def sync_redis(self) -> Any:
        """A blocking client on the stack's Redis (a cluster client on a cluster)."""
        import redis
        from redis.cluster import RedisCluster

        if self.redis_cluster:
            return RedisCluster.from_url(self.redis_url.replace("+cluster://", "://", 1))
        return redis.Redis.from_url(self.redis_url)

    def settings(self, **overrides: object) -> Settings:
        """Settings on this stack; ``overrides`` are ``STREAMRANK_*`` variables."""
        base: dict[str, object] = {
            "STREAMRANK_KAFKA_BOOTSTRAP": self.bootstrap,
            "STREAMRANK_REDIS_URL": self.redis_url,
            "STREAMRANK_RUN_DIR": self.run_dir,
            "STREAMRANK_METRICS_PORT": 0,
        }
        return Settings().with_env(**{**base, **overrides})


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackInfo]:
    """A running broker and Redis for the whole session."""
    bootstrap = os.environ.get("STREAMRANK_TEST_KAFKA_BOOTSTRAP")
    redis_url = os.environ.get("STREAMRANK_TEST_REDIS_URL")
    run_dir = tmp_path_factory.mktemp("stack")
    if bootstrap and redis_url:
        yield StackInfo(bootstrap, redis_url, run_dir)
        return
    from workbench.devstack.stack import EmbeddedStack

    cluster = os.environ.get("STREAMRANK_TEST_REDIS", "standalone") == "cluster"
    embedded = EmbeddedStack.on_free_ports(run_dir, redis_cluster=cluster)
    embedded.up(timeout_s=120)
    env = embedded.client_env()
    # Their files (a features worker's Faust data) go here, not to the checkout's .run/.
    env["STREAMRANK_RUN_DIR"] = str(tmp_path_factory.mktemp("clients"))
    saved = {k: os.environ.get(k) for k in env}
    # Subprocesses started by tests (workers, CLI) find the stack through the environment.
    os.environ.update(env)
    try:
        yield StackInfo(embedded.bootstrap, embedded.redis_url, run_dir)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        embedded.down()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: `-m cluster` sees the implied marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("cluster_only") is not None:
            item.add_marker(pytest.mark.cluster)
        elif item.get_closest_marker("cluster") and item.get_closest_marker("standalone_only"):
            raise pytest.UsageError(
                f"{item.nodeid} is marked both cluster and standalone_only: drop one of them"
            )
    on_cluster = os.environ.get("STREAMRANK_TEST_REDIS") == "cluster" or (
        os.environ.get("STREAMRANK_TEST_REDIS_URL", "").partition("://")[0].endswith("+cluster")
    )
    for item in items:
        skip_on = "standalone_only" if on_cluster else "cluster_only"
        marker = item.get_closest_marker(skip_on)
        if marker is not None:
            reason = marker.args[0] if marker.args else skip_on
            item.add_marker(pytest.mark.skip(reason=f"{skip_on.replace('_', ' ')}: {reason}"))


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic names and ids, so tests never see each other's data."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def make_settings(stack: StackInfo, unique: str) -> Callable[..., Settings]:
    """Settings on the test stack with topic names private to this test; ``overrides`` are
    ``STREAMRANK_*`` variables."""

    def factory(**overrides: object) -> Settings:
        topics: dict[str, object] = {
            "STREAMRANK_TOPIC_CLICKS": f"clicks-{unique}",
            "STREAMRANK_TOPIC_REQUESTS": f"rank-requests-{unique}",
            "STREAMRANK_TOPIC_RESULTS": f"rank-results-{unique}",
            "STREAMRANK_TOPIC_DEAD_LETTERS": f"dead-letters-{unique}",
            "STREAMRANK_ITEMS_TOPIC": f"items-{unique}",
        }
        return stack.settings(**{**topics, **overrides})

    return factory


def require_tool(name: str, *, package: str) -> str:
    """The path of an external tool a test needs. Missing: the test is skipped with the
    command that installs it, except in CI (``CI`` set), where it fails: CI must run it."""
    import shutil

    path = shutil.which(name)
    if path is None:
        why = (
            f"{name} is not installed: apt-get install -y --no-install-recommends {package} "
            "(.ci/run installs it)"
        )
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return path
