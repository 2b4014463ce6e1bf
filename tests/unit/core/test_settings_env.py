import os
from pathlib import Path

import pytest

from streamrank.settings import Settings


def test_settings_env_round_trips_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Settings().with_env(
        STREAMRANK_TOPIC_CLICKS="c-x",
        STREAMRANK_REPLY_TOPICS_ALLOWED=("a", "b"),
        STREAMRANK_FEATURES_PATH="agent",
        STREAMRANK_FEATURES_RETRY_MAX_S=0.5,
        STREAMRANK_RUN_DIR=Path("/tmp/x"),
        STREAMRANK_REDIS_URL="redis://h:1/2",
        STREAMRANK_OUTCOME_ACTIONS="click,cart",
    )
    env = original.as_env()
    assert env["STREAMRANK_FEATURES_PATH"] == "agent"
    assert env["STREAMRANK_REDIS_URL"] == "redis://h:1/2"
    assert env["STREAMRANK_OUTCOME_ACTIONS"] == "click,cart"
    for key in [k for k in os.environ if k.startswith("STREAMRANK_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert Settings() == original
    assert Settings().with_env(**env) == original


def test_every_field_has_its_own_variable() -> None:
    fields = list(Settings.env_fields())
    names = [f.env for f in fields]
    assert len(names) == len(set(names)) == 133
    assert all(name.startswith("STREAMRANK_") and name.isupper() for name in names)
    assert {f.section for f in fields} == set(Settings.model_fields)
