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

from streamrank.runtime.metrics_http import DEFAULT_PORTS
from streamrank.settings import Settings
from workbench.cli.main import build_parser

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
    fields = {field.env for field in Settings.env_fields()}
    unknown = set().union(*(env_names(doc) for doc in docs)) - fields
    assert not unknown, f"{path.name} sets variables that are not settings: {sorted(unknown)}"


def test_compose_commands_exist_and_metrics_ports_match() -> None:
    compose = load_all(ROOT / "docker-compose.yml")[0]
    parser = build_parser()
    for name in ("topics", "features", "scoring", "outcomes"):
        command = compose["services"][name]["command"]
        parser.parse_args(command)  # exits (SystemExit) on an unknown command
    healthcheck_keys = {"test", "interval", "timeout", "retries", "start_period", "start_interval"}
    for kind in ("features", "scoring", "outcomes"):
        env = compose["services"][kind]["environment"]
        assert env["STREAMRANK_METRICS_PORT"] == str(DEFAULT_PORTS[kind])
        check = compose["services"][kind]["healthcheck"]
        assert set(check) <= healthcheck_keys, set(check)
        assert f"127.0.0.1:{DEFAULT_PORTS[kind]}/readyz" in " ".join(check["test"])
    prometheus = load_all(ROOT / "deploy/prometheus/prometheus.yml")[0]
    ports = {
        job["job_name"]: job["dns_sd_configs"][0]["port"] for job in prometheus["scrape_configs"]
    }
    assert ports == {f"streamrank-{k}": p for k, p in DEFAULT_PORTS.items()}


K8S = ROOT / "deploy/k8s"
K8S_FILES = sorted(K8S.rglob("*.yaml"))


def k8s_docs() -> list[tuple[Path, Any]]:
    return [(path, doc) for path in K8S_FILES for doc in load_all(path)]


def worker(kind: str) -> dict[str, Any]:
    return next(d for d in load_all(K8S / f"{kind}.yaml") if d["kind"] == "StatefulSet")


def test_kubernetes_workers_run_real_commands_with_probes_on_their_metrics_ports() -> None:
    parser = build_parser()
    for kind in ("features", "scoring", "outcomes"):
        statefulset = worker(kind)
        container = statefulset["spec"]["template"]["spec"]["containers"][0]
        parser.parse_args(container["args"])
        assert container["ports"][0]["containerPort"] == DEFAULT_PORTS[kind]
        selector = statefulset["spec"]["selector"]["matchLabels"]
        assert selector.items() <= statefulset["spec"]["template"]["metadata"]["labels"].items()
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        env = {e["name"]: e for e in container["env"]}
        # static membership: the pod name, and a session that outlasts a restart
        assert env["STREAMRANK_KAFKA_GROUP_INSTANCE_ID"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.name"}
        }
        assert int(env["STREAMRANK_KAFKA_SESSION_TIMEOUT_MS"]["value"]) >= 10_000
        # a PodDisruptionBudget for each worker kind, selecting its pods
        [pdb] = [d for d in load_all(K8S / f"{kind}.yaml") if d["kind"] == "PodDisruptionBudget"]
        assert pdb["spec"]["selector"]["matchLabels"] == selector


@pytest.mark.parametrize("directory", ["", "keda", "hpa"])
def test_every_kustomization_resource_exists(directory: str) -> None:
    kustomization = load_all(K8S / directory / "kustomization.yaml")[0]
    for resource in kustomization["resources"]:
        assert (K8S / directory / resource).exists(), resource


BUILT_IN = ("v1", "apps/v1", "policy/v1", "autoscaling/v2", "batch/v1")


@pytest.mark.parametrize(
    ("path", "doc"),
    [(p, d) for p, d in k8s_docs() if d["apiVersion"] in BUILT_IN],
    ids=lambda v: v.name if isinstance(v, Path) else f"{v['kind']}/{v['metadata']['name']}",
)
def test_kubernetes_objects_match_the_kubernetes_schemas(path: Path, doc: Any) -> None:
    import kubernetes_validate

    # strict: an unknown or misspelt field fails, as the API server would refuse it
    kubernetes_validate.validate(doc, "1.30", strict=True)


# KEDA's ScaledObject is a CRD (no schema in kubernetes-validate): the fields we use, checked one
# by one against KEDA's documented spec (keda.sh/v1alpha1), unknown ones refused.
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        n: {"type": "string"}
                        for n in ("apiVersion", "kind", "name", "envSourceContainerName")
                    },
                },
                **{
                    n: {"type": "integer", "minimum": 0}
                    for n in (
                        "minReplicaCount",
                        "maxReplicaCount",
                        "idleReplicaCount",
                        "pollingInterval",
                        "cooldownPeriod",
                        "initialCooldownPeriod",
                    )
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "behavior": {"type": "object"},
                            },
                        },
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metadata": _STRING_MAP,
                            "authenticationRef": {"type": "object"},
                        },
                    },
                },
            },
        },
    },
}
KAFKA_TRIGGER_FIELDS = {
    "bootstrapServers", "consumerGroup", "topic", "lagThreshold", "activationLagThreshold",
    "offsetResetPolicy", "allowIdleConsumers", "scaleToZeroOnInvalidOffset",
    "excludePersistentLag", "limitToPartitionsWithLag", "partitionLimitation", "version",
    "sasl", "tls",
}  # fmt: skip


def test_keda_scaled_objects_scale_each_worker_on_its_group_lag_up_to_the_partition_count() -> None:
    import jsonschema

    settings = dict(load_all(K8S / "configmap.yaml")[0]["data"])
    partitions = int(settings["STREAMRANK_TOPIC_PARTITIONS"])
    defaults = Settings()
    expected = {
        "streamrank-features": (defaults.features.app_id, defaults.topics.clicks),
        "streamrank-scoring": (defaults.scoring.group_id, defaults.topics.requests),
    }
    scaled = load_all(K8S / "keda/scaledobjects.yaml")
    assert {d["spec"]["scaleTargetRef"]["name"] for d in scaled} == set(expected)
    for doc in scaled:
        jsonschema.validate(doc, SCALED_OBJECT)
        spec = doc["spec"]
        target = spec["scaleTargetRef"]
        assert worker(target["name"].removeprefix("streamrank-"))["kind"] == target["kind"]
        assert spec["maxReplicaCount"] == partitions
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        [trigger] = spec["triggers"]
        assert trigger["type"] == "kafka"
        assert set(trigger["metadata"]) <= KAFKA_TRIGGER_FIELDS, set(trigger["metadata"])
        group, topic = expected[target["name"]]
        assert trigger["metadata"]["consumerGroup"] == group
        assert trigger["metadata"]["topic"] == topic
        assert trigger["metadata"]["bootstrapServers"] == settings["STREAMRANK_KAFKA_BOOTSTRAP"]
        assert int(trigger["metadata"]["lagThreshold"]) > 0
    for hpa in load_all(K8S / "hpa/hpa.yaml"):
        assert hpa["spec"]["maxReplicas"] == partitions
        kind = hpa["spec"]["scaleTargetRef"]["name"].removeprefix("streamrank-")
        assert worker(kind)["kind"] == hpa["spec"]["scaleTargetRef"]["kind"]


def test_every_kubernetes_object_is_checked_by_a_schema() -> None:
    kinds = {d["apiVersion"] for _p, d in k8s_docs()}
    assert kinds <= {*BUILT_IN, "keda.sh/v1alpha1", "kustomize.config.k8s.io/v1beta1"}, kinds


def test_the_image_carries_every_package_and_only_the_runtime_dependencies() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")}
    assert {"streamrank", "schemas", "streams", "scoring", "workbench"} <= copied
    installs = [line for line in dockerfile.splitlines() if "pip install ." in line]
    assert installs and all("[" not in line for line in installs), installs
