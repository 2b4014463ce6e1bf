from pathlib import Path

from streamrank.settings import Settings
from workbench.cli.docs import render_readme

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_settings_table_is_current() -> None:
    text = README.read_text()
    assert render_readme(text) == text, "README settings table is stale: run `make docs`"
    for field in Settings.env_fields():
        assert f"`{field.env}`" in text


def test_readme_has_the_two_commands() -> None:
    text = README.read_text()
    assert "\nmake demo\n" in text and "\nmake test\n" in text
