"""The version watcher's switching logic (pointer reads replaced by a scripted sequence):
new versions are loaded and their cache warmed BEFORE the swap; failures keep the old state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from scoring.serving.metrics import ScoringMetrics
from scoring.serving.watcher import RecentIds, VersionWatcher, target_split
from streamrank.errors import UnknownVersion


class Scorer:
    def __init__(self, version: str) -> None:
        self.version = version

    def score(self, *arrays: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class Embeddings:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def lookup(self, version: str, table: str, ids: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    async def warm(self, version: str, table: str, ids: Sequence[str]) -> int:
        self.log.append(f"warm {version} {table} {','.join(ids)}")
        return len(ids)

    def stats(self) -> Mapping[str, Any]:
        return {}


class ScriptedWatcher(VersionWatcher):
    """Pointer values come from a list instead of Redis."""

    pointers: tuple[str | None, str | None] = (None, None)

    async def _read_pointers(self) -> tuple[str | None, str | None]:
        return self.pointers


def make(log: list[str], published: set[str], metrics: ScoringMetrics) -> ScriptedWatcher:
    async def loader(version: str) -> Scorer:
        if version not in published:
            raise UnknownVersion(f"{version} is not published")
        log.append(f"load {version}")
        return Scorer(version)

    recent = RecentIds(100, sample_every=1)
    recent.add(["i1", "i2"])
    recent.add(["i3"])
    return ScriptedWatcher(redis=None,  # type: ignore[arg-type]
                           loader=loader, embeddings=Embeddings(log), metrics=metrics,
                           recent=recent, warm_top_k=2)  # fmt: skip


async def test_switch_loads_and_warms_before_swapping() -> None:
    log: list[str] = []
    metrics = ScoringMetrics()
    watcher = make(log, {"a", "b"}, metrics)
    assert not await watcher.refresh() and watcher.current is None  # no pointer yet
    watcher.pointers = ("a", None)
    assert await watcher.refresh()
    assert watcher.describe() == "a:1" and log == ["load a", "warm a item i3,i2"]
    assert not await watcher.refresh()  # unchanged: nothing reloaded
    log.clear()
    watcher.pointers = ("a", "a:0.9,b:0.1")
    held_a = watcher.current.scorers["a"]  # type: ignore[union-attr]
    assert await watcher.refresh()
    assert log == ["load b", "warm b item i3,i2"]  # a is kept, not reloaded or re-warmed
    assert watcher.current is not None and watcher.current.scorers["a"] is held_a
    assert watcher.current.split == (("a", 0.9), ("b", 0.1)) and watcher.current.source == "split"
    assert metrics.model_active.labels("b")._value.get() == pytest.approx(0.1)
    watcher.pointers = ("b", None)  # split cleared: back to the pointer
    assert await watcher.refresh()
    assert watcher.describe() == "b:1"
    assert metrics.version_switches._value.get() == 3


async def test_unloadable_version_keeps_serving_the_old_one() -> None:
    log: list[str] = []
    watcher = make(log, {"a"}, ScoringMetrics())
    watcher.pointers = ("a", None)
    await watcher.refresh()
    watcher.pointers = ("missing", None)
    assert not await watcher.refresh()
    assert watcher.describe() == "a:1"


def test_target_split_precedence() -> None:
    assert target_split("x:1", "a", "a:0.5,b:0.5") == ((("x", 1.0),), "setting")
    assert target_split(None, "a", "a:0.5,b:0.5") == ((("a", 0.5), ("b", 0.5)), "split")
    assert target_split(None, "a", None) == ((("a", 1.0),), "pointer")
    assert target_split(None, None, None) is None


def test_recent_ids_keep_the_newest_within_capacity_and_sample() -> None:
    recent = RecentIds(3, sample_every=1)
    recent.add(["a", "b", "c"])
    recent.add(["b", "d"])
    assert recent.newest() == ["d", "b", "c"]
    sampled = RecentIds(10, sample_every=2)
    for batch in (["a"], ["b"], ["c"]):
        sampled.add(batch)
    assert sampled.newest() == ["c", "a"]


async def test_a_version_without_a_usable_retriever_still_serves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from streamrank.errors import ArtifactError

    held = object()

    async def retrieval(version: str) -> Any:
        if version == "b":
            raise ArtifactError(f"model version {version!r}: sr:{{model:b}}:index:0 is missing")
        return None if version == "c" else held

    async def loader(version: str) -> Scorer:
        return Scorer(version)

    metrics = ScoringMetrics()
    watcher = ScriptedWatcher(redis=None,  # type: ignore[arg-type]
                              loader=loader, embeddings=Embeddings([]), metrics=metrics,
                              retriever_loader=retrieval)  # fmt: skip
    watcher.pointers = ("a", "a:0.5,b:0.3,c:0.2")
    assert await watcher.refresh()
    assert watcher.current is not None and set(watcher.current.scorers) == {"a", "b", "c"}
    assert dict(watcher.current.retrievers) == {"a": held}
    assert metrics.retrieval_unavailable.labels("load_failed")._value.get() == 1
    assert metrics.retrieval_unavailable.labels("absent")._value.get() == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("b serves without retrieval" in m and "index:0 is missing" in m for m in errors)
    assert any("c serves without retrieval" in m and "--no-retrieval" in m for m in errors)
    # a held version keeps its retriever; nothing is loaded again
    watcher.pointers = ("a", None)
    assert await watcher.refresh()
    assert dict(watcher.current.retrievers) == {"a": held}
    assert metrics.retrieval_unavailable.labels("load_failed")._value.get() == 1
