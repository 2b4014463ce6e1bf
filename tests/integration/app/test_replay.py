"""`streamrank replay` end to end on the real broker and Redis: the scores a scoring worker serves
through Kafka, from sequences a features worker built from replayed clicks, equal the offline
scores of the same version for every candidate, and the AUC is the same."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from scoring.model.artifact import CANDIDATES_FILE, CASCADE_FILE, load_artifact
from streamrank import keys
from tests.conftest import StackInfo
from tests.integration.support.scoring import train_tiny_artifact
from workbench.cli.main import main
from workbench.devstack.cases import load_cases, offline_scores

pytestmark = pytest.mark.timeout(180)


# The whole data path on the test Redis: features written per slot, read back across nodes.
@pytest.mark.cluster
def test_replay_online_scores_equal_offline_scores(
    stack: StackInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("STREAMRANK_KAFKA_BOOTSTRAP", stack.bootstrap)
    monkeypatch.setenv("STREAMRANK_REDIS_URL", stack.redis_url)
    monkeypatch.setenv("STREAMRANK_RUN_DIR", str(tmp_path / "run"))
    path = train_tiny_artifact(tmp_path / "artifacts", seed=11)  # int8 by default
    artifact = load_artifact(path)
    cases = load_cases(path / CANDIDATES_FILE)
    client = stack.sync_redis()
    active_before = client.get(keys.active_model())

    code = main(["replay", "--artifact", str(path), "--json", "--no-progress"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["consistent"] and report["stack"] == "configured"
    assert report["version"] == artifact.version and report["encoding"] == "int8"
    assert report["users"] == report["answered"] == len(cases) == 60
    assert report["events_replayed"] == sum(len(c.history) for c in cases)
    assert report["degraded"] == 0 and report["versions_served"] == [artifact.version]
    # the default runtime served, against the torch scorer op by op offline
    assert report["runtimes_served"] == ["compiled"] and report["offline_runtime"] == "eager"
    assert report["max_abs_diff"] <= 1e-5  # every candidate of every user
    assert report["online"] == report["offline"]  # AUC and GAUC
    # the reference is the int8 table's scores, which the recorded fp32 scores are not
    int8 = offline_scores(artifact, cases, encoding="int8", max_history=20)
    fp32 = np.array([c.file_scores for c in cases])
    assert np.abs(int8 - fp32).max() > 1e-5
    assert report["offline_fp32_vs_artifact_scores_max_abs_diff"] < 1e-6
    # the replay kept to its private names: no pointer moved, sequences under its run prefix
    assert client.get(keys.active_model()) == active_before
    run = report["run"]
    seq = client.zrange(keys.sequence(f"{run}-{cases[0].user_id}"), 0, -1)
    want = [e["event_id"] for e in cases[0].history][-20:]
    assert [m.decode().split(keys.FIELD_SEP)[0] for m in seq] == [f"{run}-{e}" for e in want]
    client.close()

    # a second replay of the same (now published) version still matches
    code = main(["replay", "--artifact", str(path), "--users", "7", "--json", "--no-progress"])
    again = json.loads(capsys.readouterr().out)
    assert code == 0 and again["users"] == 7 and again["max_abs_diff"] <= 1e-5
    assert again["run"] != run


def test_replay_with_int8_dense_weights_equals_offline_int8(
    stack: StackInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Served int8 dense weights equal the offline scoring with the same option, candidate by
    # candidate (the int8 forward is per request, so batching on either side changes nothing).
    monkeypatch.setenv("STREAMRANK_KAFKA_BOOTSTRAP", stack.bootstrap)
    monkeypatch.setenv("STREAMRANK_REDIS_URL", stack.redis_url)
    monkeypatch.setenv("STREAMRANK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("STREAMRANK_SCORING_DENSE_WEIGHTS", "int8")
    monkeypatch.setenv("STREAMRANK_SCORING_FORWARD", "batched")  # padded across requests
    path = train_tiny_artifact(tmp_path / "artifacts", seed=12)
    artifact = load_artifact(path)
    cases = load_cases(path / CANDIDATES_FILE, limit=30)

    code = main(["replay", "--artifact", str(path), "--users", "30", "--json", "--no-progress"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["consistent"] and report["dense_weights"] == "int8"
    assert report["runtimes_served"] == ["int8"]
    assert report["answered"] == len(cases) == 30 and report["degraded"] == 0
    assert report["max_abs_diff"] <= 1e-5
    assert report["online"] == report["offline"]
    # the reference really is the int8 one: the served scores are much closer to it than int8
    # is to fp32 (this tiny model's scores vary little, so int8 moves them by ~2e-6 only)
    kw = {"encoding": report["encoding"], "max_history": 20}
    int8 = offline_scores(artifact, cases, dense="int8", **kw)
    fp32 = offline_scores(artifact, cases, dense="fp32", **kw)
    int8_effect = float(np.abs(int8 - fp32).max())
    assert int8_effect > 0
    assert report["max_abs_diff"] <= int8_effect / 10, (report["max_abs_diff"], int8_effect)


def test_replay_on_onnx_runtime_serves_the_graph_published_with_the_version(
    stack: StackInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # publish stores the version's ONNX graph; the worker loads it, checks it against the
    # version's weights and serves it within the tolerance of the torch scorer.
    monkeypatch.setenv("STREAMRANK_KAFKA_BOOTSTRAP", stack.bootstrap)
    monkeypatch.setenv("STREAMRANK_REDIS_URL", stack.redis_url)
    monkeypatch.setenv("STREAMRANK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("STREAMRANK_SCORING_RUNTIME", "onnx")
    path = train_tiny_artifact(tmp_path / "artifacts", seed=14)
    code = main(["replay", "--artifact", str(path), "--users", "20", "--json", "--no-progress"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["consistent"] and report["runtimes_served"] == ["onnx"]
    assert report["answered"] == 20 and report["max_abs_diff"] <= 1e-5
    client = stack.sync_redis()
    assert (client.strlen(keys.model_graph(report["version"])) or 0) > 0
    client.close()


def test_replay_of_a_version_with_counters_and_context_is_consistent(
    stack: StackInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The whole log replayed at its own (historical) times; every request as of its test
    # sample's time: counters and context online equal the training code's, candidate by candidate.
    from scoring.model.features import FAMILIES

    monkeypatch.setenv("STREAMRANK_KAFKA_BOOTSTRAP", stack.bootstrap)
    monkeypatch.setenv("STREAMRANK_REDIS_URL", stack.redis_url)
    monkeypatch.setenv("STREAMRANK_RUN_DIR", str(tmp_path / "run"))
    path = train_tiny_artifact(tmp_path / "artifacts", seed=13, families=FAMILIES)
    artifact = load_artifact(path)
    features = artifact.scorer().features
    assert features.counters and features.has("context")
    cases = load_cases(path / CANDIDATES_FILE)
    assert any(any(row) for c in cases for row in (c.features or {})["counters"])

    code = main(["replay", "--artifact", str(path), "--json", "--no-progress"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    report = json.loads(out.out)
    assert report["consistent"] and report["answered"] == len(cases) and report["degraded"] == 0
    assert report["events_replayed"] > sum(len(c.history) for c in cases)  # the whole log
    assert report["max_abs_diff"] <= 1e-5 and report["online"] == report["offline"]
    assert report["runtimes_served"] == ["compiled"]  # side inputs through the compiled graph
    # the side inputs mattered: without them (all zero) the expectation differs
    blank = [dataclasses.replace(c, features={k: np.zeros_like(v).tolist()
                                              for k, v in (c.features or {}).items()})
             for c in cases]  # fmt: skip
    kw = {"encoding": report["encoding"], "max_history": 20}
    assert (
        np.abs(offline_scores(artifact, blank, **kw) - offline_scores(artifact, cases, **kw)).max()
        > 1e-4
    )
    # the run's item counter keys and user keys are gone
    client = stack.sync_redis()
    assert not list(client.scan_iter(match=keys.user_keys_pattern(f"{report['run']}-*")))
    client.close()


def test_cascade_replay_of_a_version_with_counters_reproduces_the_offline_cascade(
    stack: StackInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One retrieval request per test user, the whole log replayed at its own times: the online
    # cascade's top-10 (retrieval, filter, coarse cut, DIN with counters, rerank) is the offline
    # one with the int8 table, item for item, in the same order.
    from scoring.model.features import FAMILIES
    from workbench.devstack.cascadecases import load_cascade_cases

    monkeypatch.setenv("STREAMRANK_KAFKA_BOOTSTRAP", stack.bootstrap)
    monkeypatch.setenv("STREAMRANK_REDIS_URL", stack.redis_url)
    monkeypatch.setenv("STREAMRANK_RUN_DIR", str(tmp_path / "run"))
    path = train_tiny_artifact(tmp_path / "artifacts", seed=13, families=FAMILIES)
    artifact = load_artifact(path)
    assert artifact.scorer().features.counters
    cases = load_cascade_cases(path / CASCADE_FILE)

    code = main(["replay", "--cascade", "--artifact", str(path), "--json", "--no-progress"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    report = json.loads(out.out)
    assert report["consistent"] and report["version"] == artifact.version
    assert report["encoding"] == "int8" and report["tolerance"] == 1e-4
    assert report["users"] == report["answered"] == report["same_items"] == len(cases) == 60
    assert report["degraded"] == report["cached"] == 0
    assert report["max_abs_diff"] <= 1e-4
    assert report["hr@10"]["online"] == report["hr@10"]["offline"]
    assert report["events_replayed"] > sum(len(c.history) for c in cases)  # the whole log
    assert report["cascade"] == artifact.config["retrieval"]["train"]["cascade"]
    # the offline pass on the fp32 table reproduces the artifact's file
    assert report["offline_fp32_vs_artifact"]["same_items"] == len(cases)
    assert report["offline_fp32_vs_artifact"]["max_abs_diff"] < 1e-6
    # ... which is not the reference: on the int8 table some users' lists differ
    assert report["offline_vs_offline_fp32"]["same_items"] < len(cases)
    # the run's user keys are gone
    client = stack.sync_redis()
    assert not list(client.scan_iter(match=keys.user_keys_pattern(f"{report['run']}-*")))
    client.close()
