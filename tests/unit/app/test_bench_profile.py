"""`streamrank bench profile`: py-spy stacks put in classes (model, ours, each library, startup)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from workbench.bench.profile import classify, run, summarise

OURS = ("scoring", "streams", "schemas", "streamrank")
LOOP = "_run_module_as_main (<frozen runpy>:198);BaseEventLoop._run_once (asyncio/base_events.py:1922)"  # fmt: skip
RAW = [
    f"{LOOP};RankService._rank_live (scoring/serving/service.py:196);forward (scoring/serving/service.py:81);DinScorer.score (scoring/model/din.py:345);DinScorer._logits (scoring/model/din.py:301) 60\n",
    f"{LOOP};FeatureReader.get_sequences (streams/reader.py:86);parse_member (streams/reader.py:57) 10\n",
    f"{LOOP};NodePipeline.execute (streamrank/redis/pipeline.py:143);Pipeline.execute (redis/asyncio/client.py:2262) 8\n",
    f"{LOOP};EpollSelector.select (selectors.py:468) 6\n",
    f"{LOOP};decode_request (schemas/decode.py:80);loads (json/__init__.py:346) 4\n",
    "_run_module_as_main (<frozen runpy>:198);<module> (workbench/cli/__main__.py:5);_find_and_load (<frozen importlib._bootstrap>:1176) 12\n",
    f"{LOOP};Fetcher._fetch (aiokafka/consumer/fetcher.py:400);PyObject_Call (libpython3.11.so) 2\n",
    "garbage line without a count\n",
    "\n",
]


def test_each_sample_goes_to_the_innermost_python_frame_s_package() -> None:
    frames = RAW[2].rsplit(" ", 1)[0].split(";")
    assert classify(frames, OURS) == "library:redis"
    assert classify(RAW[0].rsplit(" ", 1)[0].split(";"), OURS) == "model_forward"
    assert classify(RAW[3].rsplit(" ", 1)[0].split(";"), OURS) == "library:asyncio"
    assert classify(RAW[4].rsplit(" ", 1)[0].split(";"), OURS) == "library:python"  # stdlib json
    # a native frame counts for the Python frame that called it
    assert classify(RAW[6].rsplit(" ", 1)[0].split(";"), OURS) == "library:aiokafka"


def test_shares_with_and_without_startup_and_our_top_frames() -> None:
    out = summarise(RAW, ours=OURS, top=3)
    assert out["samples"] == 102
    assert out["share"]["model_forward"] == round(60 / 102, 4)
    assert out["share"]["startup"] == round(12 / 102, 4)
    steady = out["steady_share"]
    assert "startup" not in steady and steady["model_forward"] == round(60 / 90, 4)
    assert steady["ours"] == round(10 / 90, 4) and steady["library:redis"] == round(8 / 90, 4)
    assert abs(sum(steady.values()) - 1) < 1e-3
    assert out["top_ours_steady_share"] == {"parse_member": round(10 / 90, 4)}


def test_run_refuses_a_file_without_samples(tmp_path: Path) -> None:
    empty = tmp_path / "empty.raw"
    empty.write_text("not a profile\n")
    args = argparse.Namespace(raw=empty, ours="scoring", top=5)
    with pytest.raises(SystemExit, match="no samples"):
        run(args, None)  # type: ignore[arg-type]
