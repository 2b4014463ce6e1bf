"""What every settings section shares: frozen, strict about names, and one environment
variable per field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict


def split_csv(value: Any) -> Any:
    """``"a, b"`` -> ``("a", "b")``: how a list setting is written in the environment."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


CsvTuple = Annotated[tuple[str, ...], BeforeValidator(split_csv)]


class Section(BaseModel):
    """One frozen group of settings. A field's environment variable is ``env_prefix`` + its
    name, upper-cased, unless ``env_names`` names it (the names predate the sections)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    env_prefix: ClassVar[str] = "STREAMRANK_"
    env_names: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def env_name(cls, field: str) -> str:
        """The ``STREAMRANK_*`` variable that sets ``field``."""
        return cls.env_names.get(field) or cls.env_prefix + field.upper()
