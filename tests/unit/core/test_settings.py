from pathlib import Path

import pytest
from pydantic import ValidationError

from streamrank.settings import Settings


def test_defaults_point_at_the_embedded_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("STREAMRANK_KAFKA_BOOTSTRAP", "STREAMRANK_REDIS_URL"):
        monkeypatch.delenv(key, raising=False)
    settings = Settings(stack_kafka_port=19092, stack_redis_port=16379)
    assert settings.kafka_bootstrap == "127.0.0.1:19092"
    assert settings.redis_dsn == "redis://127.0.0.1:16379/0"
    assert settings.all_topics() == ("clicks", "rank-requests", "rank-results", "dead-letters")


def test_environment_overrides_and_secrets_stay_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRANK_KAFKA_BOOTSTRAP", "kafka-1:9093,kafka-2:9093")
    monkeypatch.setenv("STREAMRANK_REDIS_URL", "redis://:hunter2@redis:6379/1")
    monkeypatch.setenv("STREAMRANK_TOPIC_PARTITIONS", "12")
    monkeypatch.setenv("STREAMRANK_REPLY_TOPICS_ALLOWED", "a-replies, b-replies")
    settings = Settings()
    assert settings.kafka_bootstrap == "kafka-1:9093,kafka-2:9093"
    assert settings.topic_partitions == 12
    assert settings.reply_topics_allowed == ("a-replies", "b-replies")
    assert "hunter2" not in repr(settings)
    assert settings.redis_dsn.endswith("@redis:6379/1")


def test_sasl_settings_pass_through_to_aiokafka(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRANK_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("STREAMRANK_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("STREAMRANK_KAFKA_SASL_USERNAME", "svc")
    monkeypatch.setenv("STREAMRANK_KAFKA_SASL_PASSWORD", "s3cret")
    kwargs = Settings().kafka_client_kwargs()
    assert kwargs["security_protocol"] == "SASL_PLAINTEXT"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-256"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("svc", "s3cret")


def test_settings_are_frozen_and_validated(tmp_path: Path) -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.sequence_length = 3  # type: ignore[misc]
    with pytest.raises(ValidationError, match="topic_partitions"):
        Settings(topic_partitions=0)


def test_settings_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "streamrank.env").write_text("STREAMRANK_SEQUENCE_LENGTH=77\n")
    assert Settings().sequence_length == 77
    monkeypatch.setenv("STREAMRANK_SEQUENCE_LENGTH", "12")
    assert Settings().sequence_length == 12
