"""The root settings object: one frozen section per part of the engine, read from
``STREAMRANK_*`` environment variables and an optional dotenv-style file."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from dotenv import dotenv_values
from pydantic import BaseModel, Field, SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from streamrank.settings.base import Section
from streamrank.settings.cascade import CascadeSettings
from streamrank.settings.connections import KafkaSettings, RedisSettings
from streamrank.settings.messages import LimitSettings, TopicSettings
from streamrank.settings.observability import ObservabilitySettings
from streamrank.settings.retrain import RetrainSettings
from streamrank.settings.stages import (
    EmbeddingSettings,
    FeatureSettings,
    OutcomeSettings,
    ScoringSettings,
)
from streamrank.settings.tools import ToolSettings

SETTINGS_FILE = "STREAMRANK_SETTINGS_FILE"


class SettingsError(ValueError):
    """Settings that do not validate; the message names the ``STREAMRANK_*`` variables."""


class EnvField(NamedTuple):
    """One setting: its environment variable, section, field name and definition."""

    env: str
    section: str
    name: str
    info: FieldInfo


def embedded_bootstrap(port: int) -> str:
    """The embedded broker's address on ``port``."""
    return f"127.0.0.1:{port}"


def embedded_redis_url(port: int) -> str:
    """The embedded Redis's URL on ``port``."""
    return f"redis://127.0.0.1:{port}/0"


class Settings(BaseSettings):
    """All runtime configuration: ``Settings()`` reads the environment (and the settings
    file); :meth:`with_env` makes a variant. Each component is handed the sections it uses."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    topics: TopicSettings = Field(default_factory=TopicSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    features: FeatureSettings = Field(default_factory=FeatureSettings)
    embeddings: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    scoring: ScoringSettings = Field(default_factory=ScoringSettings)
    cascade: CascadeSettings = Field(default_factory=CascadeSettings)
    outcomes: OutcomeSettings = Field(default_factory=OutcomeSettings)
    retrain: RetrainSettings = Field(default_factory=RetrainSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    tools: ToolSettings = Field(default_factory=ToolSettings)

    def __init__(self, **no_arguments: Any) -> None:
        if no_arguments:
            raise TypeError(
                "Settings() takes no arguments: use Settings().with_env(STREAMRANK_...=...)"
            )
        try:
            super().__init__()
        except ValidationError as exc:
            raise SettingsError(describe(exc)) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Environment variables win over the settings file (``STREAMRANK_SETTINGS_FILE``,
        default ``streamrank.env`` in the working directory)."""
        path = Path(os.environ.get(SETTINGS_FILE, "streamrank.env"))
        from_file = dotenv_values(path, encoding="utf-8") if path.is_file() else {}
        return (
            _VariablesSource(settings_cls, os.environ),
            _VariablesSource(settings_cls, from_file),
        )

    @classmethod
    def env_fields(cls) -> Iterator[EnvField]:
        """Every setting, section by section, in the order of the README table."""
        for section, field in cls.model_fields.items():
            model = field.annotation
            assert isinstance(model, type) and issubclass(model, Section)
            for name, info in model.model_fields.items():
                yield EnvField(model.env_name(name), section, name, info)

    @model_validator(mode="before")
    @classmethod
    def _embedded_defaults(cls, data: Any) -> Any:
        """Unset endpoints point at the embedded stack's ports."""
        if not isinstance(data, dict):
            return data
        tools, kafka, redis = (_as_dict(data.get(name)) for name in ("tools", "kafka", "redis"))
        if not kafka.get("bootstrap"):
            kafka["bootstrap"] = embedded_bootstrap(tools.get("stack_kafka_port", 9092))
        if not redis.get("url"):
            redis["url"] = embedded_redis_url(tools.get("stack_redis_port", 6379))
        return {**data, "kafka": kafka, "redis": redis}

    def with_env(self, **overrides: object) -> Settings:
        """These settings with some ``STREAMRANK_*`` variables set otherwise, e.g.
        ``settings.with_env(STREAMRANK_TOPIC_CLICKS="c2", **more)``: the one way to vary
        settings in code (tests, tools, command-line flags). Values are strings as in the
        environment, or typed values; None unsets an optional setting. An endpoint left at the
        embedded stack's default follows a changed stack port."""
        fields = {f.env: f for f in self.env_fields()}
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ValueError(f"not settings: {unknown}; `streamrank settings --table` lists them")
        values = {name: getattr(self, name).model_dump() for name in type(self).model_fields}
        for env, value in overrides.items():
            values[fields[env].section][fields[env].name] = value
        tools = self.tools
        if values["kafka"]["bootstrap"] == embedded_bootstrap(tools.stack_kafka_port):
            values["kafka"]["bootstrap"] = overrides.get("STREAMRANK_KAFKA_BOOTSTRAP", "")
        if values["redis"]["url"] == SecretStr(embedded_redis_url(tools.stack_redis_port)):
            values["redis"]["url"] = overrides.get("STREAMRANK_REDIS_URL", "")
        # Validated as the environment's values are, without reading the environment again.
        variant = type(self).__new__(type(self))
        try:
            BaseModel.__init__(variant, **values)
        except ValidationError as exc:
            raise SettingsError(describe(exc)) from None
        return variant

    def as_env(self) -> dict[str, str]:
        """``STREAMRANK_*`` variables that hand every setting to a child process (workers)."""
        env: dict[str, str] = {}
        for field in self.env_fields():
            value = getattr(getattr(self, field.section), field.name)
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if isinstance(value, tuple):
                value = ",".join(value)
            if value is not None:
                env[field.env] = str(value)
        return env


def describe(error: ValidationError) -> str:
    """The errors of a validation, each under the variable that sets the value (the value
    shown too, unless it is a secret)."""
    fields = {(f.section, f.name): f for f in Settings.env_fields()}
    parts = []
    for item in error.errors():
        loc = tuple(str(part) for part in item["loc"])
        field = fields.get((loc[0], loc[1])) if len(loc) >= 2 else None
        if field is None:
            parts.append(f"{'.'.join(loc) or 'settings'}: {item['msg']}")
            continue
        secret = "SecretStr" in str(field.info.annotation)
        shown = "" if secret else f" (got {item['input']!r})"
        parts.append(f"{field.env}: {item['msg']}{shown}")
    return "; ".join(parts)


def _as_dict(section: Any) -> dict[str, Any]:
    """A section's values as a new dict, whether given as a model, a dict or not at all."""
    if isinstance(section, BaseModel):
        return section.model_dump()
    return dict(section or {})


class _VariablesSource(PydanticBaseSettingsSource):
    """The ``STREAMRANK_*`` settings found in one set of variables (names case-insensitive),
    as section values; other names are ignored."""

    def __init__(self, settings_cls: type[BaseSettings], variables: Mapping[str, str | None]):
        super().__init__(settings_cls)
        self._variables = {k.upper(): v for k, v in variables.items() if v is not None}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every section at once

    def __call__(self) -> dict[str, Any]:
        values: dict[str, dict[str, Any]] = {}
        for field in Settings.env_fields():
            if field.env in self._variables:
                values.setdefault(field.section, {})[field.name] = self._variables[field.env]
        return values


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
