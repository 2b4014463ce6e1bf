"""``streamrank settings``: the effective settings (secrets masked), or the README table."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import SecretStr

from streamrank.settings import Settings


def settings_table() -> str:
    """A Markdown table of every setting: environment variable, default, description."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=False)
        if isinstance(default, SecretStr):
            default = default.get_secret_value()
        shown = "(computed)" if field.default_factory is not None else repr(default)
        if default in ("", None) and name in ("kafka_bootstrap", "redis_url"):
            shown = "embedded stack"
        rows.append(f"| `STREAMRANK_{name.upper()}` | `{shown}` | {field.description or ''} |")
    return "\n".join(rows)


def _settings(args: argparse.Namespace, settings: Settings) -> int:
    from workbench.cli.common import print_json

    if args.table:
        print(settings_table())
        return 0
    values: dict[str, Any] = {}
    for name in Settings.model_fields:
        value = getattr(settings, name)
        values[name] = "**********" if isinstance(value, SecretStr) else value
    print_json(
        {
            k: (str(v) if not isinstance(v, int | float | bool | str | None | tuple) else v)
            for k, v in values.items()
        }
    )
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser("settings", help="print the effective settings (secrets masked)")
    parser.add_argument(
        "--table", action="store_true", help="print the Markdown table of all settings"
    )
    parser.set_defaults(func=_settings)
