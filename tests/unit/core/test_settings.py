from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from streamrank.settings import ScoringSettings, Settings
from streamrank.settings.root import SettingsError


def test_defaults_point_at_the_embedded_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("STREAMRANK_KAFKA_BOOTSTRAP", "STREAMRANK_REDIS_URL"):
        monkeypatch.delenv(key, raising=False)
    settings = Settings().with_env(
        STREAMRANK_STACK_KAFKA_PORT=19092, STREAMRANK_STACK_REDIS_PORT=16379
    )
    assert settings.kafka.bootstrap == "127.0.0.1:19092"
    assert settings.redis.dsn == "redis://127.0.0.1:16379/0"
    assert settings.topics.names() == (
        "clicks",
        "rank-requests",
        "rank-results",
        "dead-letters",
        "items",
    )
    moved = settings.with_env(STREAMRANK_KAFKA_BOOTSTRAP="k:1", STREAMRANK_STACK_KAFKA_PORT=1)
    assert moved.kafka.bootstrap == "k:1", "an endpoint that was set stays set"


def test_environment_overrides_and_secrets_stay_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRANK_KAFKA_BOOTSTRAP", "kafka-1:9093,kafka-2:9093")
    monkeypatch.setenv("STREAMRANK_REDIS_URL", "redis://:hunter2@redis:6379/1")
    monkeypatch.setenv("STREAMRANK_TOPIC_PARTITIONS", "12")
    monkeypatch.setenv("STREAMRANK_REPLY_TOPICS_ALLOWED", "a-replies, b-replies")
    monkeypatch.setenv("streamrank_outcome_window_s", "90")  # names are case-insensitive
    settings = Settings()
    assert settings.kafka.bootstrap == "kafka-1:9093,kafka-2:9093"
    assert settings.topics.partitions == 12
    assert settings.topics.reply_allowed == ("a-replies", "b-replies")
    assert settings.outcomes.window_s == 90
    assert "hunter2" not in repr(settings)
    assert settings.redis.dsn.endswith("@redis:6379/1")


def test_sasl_settings_pass_through_to_aiokafka(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRANK_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("STREAMRANK_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("STREAMRANK_KAFKA_SASL_USERNAME", "svc")
    monkeypatch.setenv("STREAMRANK_KAFKA_SASL_PASSWORD", "s3cret")
    kwargs = Settings().kafka.client_kwargs()
    assert kwargs["security_protocol"] == "SASL_PLAINTEXT"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-256"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("svc", "s3cret")


def test_settings_are_frozen_and_errors_name_the_variable() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.features.sequence_length = 3  # type: ignore[misc]
    with pytest.raises(ValidationError):
        settings.features = settings.features  # type: ignore[misc]
    with pytest.raises(
        SettingsError, match=r"STREAMRANK_TOPIC_PARTITIONS: .*greater than .*\(got 0\)"
    ):
        settings.with_env(STREAMRANK_TOPIC_PARTITIONS=0)
    with pytest.raises(SettingsError, match="STREAMRANK_REDIS_URL") as caught:
        settings.with_env(STREAMRANK_REDIS_URL=7, STREAMRANK_KAFKA_SASL_PASSWORD=8)
    assert "(got 7)" not in str(caught.value), "a secret's value is never shown"


def test_overrides_use_the_variable_names_and_only_those() -> None:
    settings = Settings().with_env(STREAMRANK_SCORING_BUDGET_MS="75", STREAMRANK_CANARY_SPLIT="a:1")
    assert settings.scoring.budget_ms == 75 and settings.scoring.canary_split == "a:1"
    assert settings.with_env(STREAMRANK_CANARY_SPLIT=None).scoring.canary_split is None
    assert settings.with_env(STREAMRANK_REDIS_URL=SecretStr("redis://h:1/0")).redis.dsn == (
        "redis://h:1/0"
    )
    with pytest.raises(ValueError, match="STREAMRANK_SCORING_BUDGET"):
        settings.with_env(STREAMRANK_SCORING_BUDGET=1)
    with pytest.raises(TypeError, match="with_env"):
        Settings(scoring={"budget_ms": 1})  # type: ignore[call-arg]


def test_sections_validate_across_their_fields() -> None:
    with pytest.raises(SettingsError, match="exclude each other"):
        Settings().with_env(
            STREAMRANK_REDIS_SENTINELS="s1:26379", STREAMRANK_REDIS_URL="redis+cluster://h:1/0"
        )
    assert ScoringSettings().budget_ms == Settings().scoring.budget_ms


def test_settings_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "streamrank.env").write_text("STREAMRANK_SEQUENCE_LENGTH=77\n")
    assert Settings().features.sequence_length == 77
    monkeypatch.setenv("STREAMRANK_SEQUENCE_LENGTH", "12")
    assert Settings().features.sequence_length == 12
    named = tmp_path / "other.env"
    named.write_text("STREAMRANK_TOPIC_CLICKS=c-file\n")
    monkeypatch.setenv("STREAMRANK_SETTINGS_FILE", str(named))
    assert Settings().topics.clicks == "c-file"
