"""Online outcomes and rollouts refuse a Redis Cluster up front (their join script spans one
user's keys and the global ones, which a cluster refuses as CROSSSLOT mid-run)."""

from __future__ import annotations

import pytest

from scoring.rollout.join import require_single_redis
from scoring.rollout.worker import OutcomesWorker
from streamrank.errors import ConfigError
from streamrank.settings import Settings
from workbench.cli.main import main


@pytest.mark.parametrize(
    "overrides",
    [
        {"STREAMRANK_REDIS_URL": "redis+cluster://127.0.0.1:7000/0"},
        {"STREAMRANK_REDIS_CLUSTER": True},
    ],
)
def test_a_cluster_is_refused_with_what_to_do(overrides: dict[str, object]) -> None:
    settings = Settings().with_env(STREAMRANK_SERVED_LOG_TOPIC="served", **overrides)
    with pytest.raises(ConfigError, match="standalone or Sentinel Redis"):
        require_single_redis(settings.redis)
    with pytest.raises(ConfigError, match="not cluster-safe yet"):
        OutcomesWorker(settings=settings)


def test_standalone_and_sentinel_are_accepted() -> None:
    require_single_redis(Settings().with_env(STREAMRANK_REDIS_URL="redis://127.0.0.1:6379/0").redis)
    require_single_redis(Settings().with_env(STREAMRANK_REDIS_SENTINELS=("127.0.0.1:26379",)).redis)


def test_the_cli_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STREAMRANK_REDIS_URL", "redis+cluster://127.0.0.1:7000/0")
    assert main(["rollout", "status"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("streamrank: online outcomes and staged rollouts need a standalone")
