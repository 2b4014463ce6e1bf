"""Canary split parsing and the stable user -> version assignment."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scoring.model.canary import assign, parse_split, user_bucket
from streamrank.errors import ConfigError


def test_parse_split_normalises_weights() -> None:
    assert parse_split("din-a:0.9, din-b:0.1") == (("din-a", 0.9), ("din-b", 0.1))
    assert parse_split("a:3,b:1") == (("a", 0.75), ("b", 0.25))
    assert parse_split("v:1:0.5,w:0.5") == (("v:1", 0.5), ("w", 0.5))  # ':' inside a version


@pytest.mark.parametrize("bad", ["", "a", "a:x", "a:-1", "a:0", "a:1,a:2", ":1"])
def test_parse_split_refuses_nonsense(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_split(bad)


def test_assignment_follows_the_weights_and_is_stable() -> None:
    split = parse_split("a:0.9,b:0.1")
    users = [f"user-{i}" for i in range(20_000)]
    first = assign(users, split)
    assert first == assign(users, split)
    share_b = first.count("b") / len(users)
    assert 0.09 < share_b < 0.11
    # Growing the canary only moves users from a to b, never the other way.
    grown = assign(users, parse_split("a:0.8,b:0.2"))
    assert all(g == "b" for f, g in zip(first, grown, strict=True) if f == "b")


def test_bucket_is_the_same_in_another_process() -> None:
    # Python's hash() is salted per process; the assignment must not be.
    code = "from scoring.model.canary import user_bucket; print(repr(user_bucket('alice')))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(other.stdout) == user_bucket("alice")
    assert 0.0 <= user_bucket("alice") < 1.0
