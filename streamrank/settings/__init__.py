"""The settings: one frozen :class:`Settings` of frozen sections (``settings.kafka``,
``settings.redis``, ...), read from ``STREAMRANK_*`` environment variables.

Every setting is documented in README.md ("Settings"); the defaults are the ones a single-host
demo on the embedded stack wants. An optional dotenv-style file can be named by
``STREAMRANK_SETTINGS_FILE`` (default ``streamrank.env`` in the working directory, if present).
Environment variables win over the file. Variants are made with :meth:`Settings.with_env`.
"""

from streamrank.settings.base import CsvTuple, Section
from streamrank.settings.cascade import CascadeSettings, SceneRule
from streamrank.settings.connections import (
    Compression,
    IsolationLevel,
    KafkaSettings,
    RedisSettings,
    SaslMechanism,
    SecurityProtocol,
)
from streamrank.settings.messages import LimitSettings, TopicSettings
from streamrank.settings.observability import ObservabilitySettings
from streamrank.settings.retrain import RetrainSettings
from streamrank.settings.root import EnvField, Settings, get_settings
from streamrank.settings.stages import (
    EmbeddingSettings,
    FeatureSettings,
    OutcomeSettings,
    ScoringSettings,
)
from streamrank.settings.tools import ToolSettings

__all__ = [
    "CascadeSettings",
    "Compression",
    "CsvTuple",
    "EmbeddingSettings",
    "EnvField",
    "FeatureSettings",
    "IsolationLevel",
    "KafkaSettings",
    "LimitSettings",
    "ObservabilitySettings",
    "OutcomeSettings",
    "RedisSettings",
    "RetrainSettings",
    "SaslMechanism",
    "SceneRule",
    "ScoringSettings",
    "Section",
    "SecurityProtocol",
    "Settings",
    "ToolSettings",
    "TopicSettings",
    "get_settings",
]
