"""docker-compose, Kubernetes and Prometheus files are valid and agree with the code.

No Docker engine or cluster runs here, so these files are validated as files: they parse, every
``STREAMRANK_*`` variable they set is a real setting, the worker commands exist in the CLI, and
the metrics ports agree with the workers' defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from streamrank.cli.main import build_parser
from streamrank.metrics_http import DEFAULT_PORTS
from streamrank.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
DEPLOY_FILES = sorted(
    [ROOT / "docker-compose.yml", *ROOT.glob("deploy/**/*.yml"), *ROOT.glob("deploy/**/*.yaml")]
)


def load_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def env_names(node: Any) -> set[str]:
    """Every STREAMRANK_* name set anywhere in a parsed document."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and key.startswith("STREAMRANK_"):
                found.add(key)
            if key == "name" and isinstance(value, str) and value.startswith("STREAMRANK_"):
                found.add(value)
            found |= env_names(value)
    elif isinstance(node, list):
        for value in node:
            found |= env_names(value)
    return found


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_file_parses_and_sets_only_real_settings(path: Path) -> None:
    docs = load_all(path)
    assert docs, f"{path} is empty"
    fields = {f"STREAMRANK_{name.upper()}" for name in Settings.model_fields}
    unknown = set().union(*(env_names(doc) for doc in docs)) - fields
    assert not unknown, f"{path.name} sets variables that are not settings: {sorted(unknown)}"


def test_compose_commands_exist_and_metrics_ports_match() -> None:
    compose = load_all(ROOT / "docker-compose.yml")[0]
    parser = build_parser()
    for name in ("topics", "features", "scoring", "outcomes"):
        command = compose["services"][name]["command"]
        parser.parse_args(command)  # exits (SystemExit) on an unknown command
    for kind in ("features", "scoring", "outcomes"):
        env = compose["services"][kind]["environment"]
        assert env["STREAMRANK_METRICS_PORT"] == str(DEFAULT_PORTS[kind])
    prometheus = load_all(ROOT / "deploy/prometheus/prometheus.yml")[0]
    ports = {
        job["job_name"]: job["dns_sd_configs"][0]["port"] for job in prometheus["scrape_configs"]
    }
    assert ports == {f"streamrank-{k}": p for k, p in DEFAULT_PORTS.items()}


def test_kubernetes_workers_run_real_commands_on_their_metrics_ports() -> None:
    parser = build_parser()
    for kind in ("features", "scoring", "outcomes"):
        deployment = next(
            d for d in load_all(ROOT / f"deploy/k8s/{kind}.yaml") if d["kind"] == "Deployment"
        )
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        parser.parse_args(container["args"])
        assert container["ports"][0]["containerPort"] == DEFAULT_PORTS[kind]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    kustomization = load_all(ROOT / "deploy/k8s/kustomization.yaml")[0]
    for resource in kustomization["resources"]:
        assert (ROOT / "deploy/k8s" / resource).exists()
