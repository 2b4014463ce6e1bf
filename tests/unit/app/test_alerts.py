"""The alert rules load (`promtool check rules`), behave as their unit tests say (`promtool test
rules`: series that must and must not fire), cover every rule, and point at a runbook section
that exists in the docs (docs/operations.md, or the guide of the part it watches)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.conftest import require_tool

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy/prometheus/alerts.yml"
RULE_TESTS = ROOT / "deploy/prometheus/alerts_test.yml"


def rules() -> list[dict]:  # type: ignore[type-arg]
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_checks_the_rules() -> None:
    promtool = require_tool("promtool", package="prometheus")
    done = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    promtool = require_tool("promtool", package="prometheus")
    done = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_unit_tested() -> None:
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    }
    assert {r["alert"] for r in rules()} <= tested


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_runbook_section() -> None:
    for rule in rules():
        runbook = rule["annotations"]["runbook"]
        path, _, fragment = runbook.partition("#")
        assert path.startswith("docs/") and (ROOT / path).is_file(), (rule["alert"], runbook)
        text = (ROOT / path).read_text()
        anchors = {anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
        assert fragment in anchors, (rule["alert"], runbook)
        assert rule["labels"]["severity"] in ("page", "warn")
