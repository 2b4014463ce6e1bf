"""Keep generated parts of README.md current (``make docs``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from workbench.cli.settings import settings_table

_BLOCK = re.compile(r"(<!-- settings:start[^>]*-->\n).*?(<!-- settings:end -->)", re.S)


def render_readme(text: str) -> str:
    """README text with the settings table replaced by the current one."""
    return _BLOCK.sub(lambda m: m.group(1) + settings_table() + "\n" + m.group(2), text)


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    text = path.read_text()
    path.write_text(render_readme(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
