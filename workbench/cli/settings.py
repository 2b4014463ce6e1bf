"""``streamrank settings``: the effective settings (secrets masked), or the README table."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import SecretStr

from streamrank.settings import Settings

EMBEDDED = ("kafka.bootstrap", "redis.url")  # unset: the embedded stack's


def settings_table() -> str:
    """A Markdown table of every setting: environment variable, where the code reads it
    (section.field), default, description."""
    rows = ["| variable | setting | default | meaning |", "|---|---|---|---|"]
    for field in Settings.env_fields():
        setting = f"{field.section}.{field.name}"
        default = field.info.get_default(call_default_factory=False)
        if isinstance(default, SecretStr):
            default = default.get_secret_value()
        shown = "(computed)" if field.info.default_factory is not None else repr(default)
        if default in ("", None) and setting in EMBEDDED:
            shown = "embedded stack"
        meaning = field.info.description or ""
        rows.append(f"| `{field.env}` | `{setting}` | `{shown}` | {meaning} |")
    return "\n".join(rows)


def _shown(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return "**********"
    return value if isinstance(value, int | float | bool | str | None | tuple) else str(value)


def _settings(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.cli.common import print_json

    if args.table:
        print(settings_table())
        return 0
    values: dict[str, dict[str, Any]] = {}
    for field in settings.env_fields():
        value = getattr(getattr(settings, field.section), field.name)
        values.setdefault(field.section, {})[field.name] = _shown(value)
    print_json(values)
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser("settings", help="print the effective settings (secrets masked)")
    parser.add_argument(
        "--table", action="store_true", help="print the Markdown table of all settings"
    )
    parser.set_defaults(func=_settings)
