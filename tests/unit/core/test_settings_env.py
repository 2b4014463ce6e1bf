import os
from pathlib import Path

import pytest

from streamrank.settings import Settings


def test_settings_env_round_trips_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Settings(
        topic_clicks="c-x",
        reply_topics_allowed=("a", "b"),
        features_path="agent",
        features_retry_max_s=0.5,
        run_dir=Path("/tmp/x"),
        redis_url="redis://h:1/2",
    )
    env = original.as_env()
    assert env["STREAMRANK_FEATURES_PATH"] == "agent"
    assert env["STREAMRANK_REDIS_URL"] == "redis://h:1/2"
    for key in [k for k in os.environ if k.startswith("STREAMRANK_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert Settings() == original
