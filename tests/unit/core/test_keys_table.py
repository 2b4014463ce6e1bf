"""The docstring table of :mod:`streamrank.keys` (and of :mod:`streamrank.outcome_keys`, whose
builders it re-exports) lists every key builder of its module, and nothing else.

What counts as a key builder: a public function defined in ``streamrank.keys``, annotated to
return ``str``, that called with sample arguments returns a full key, i.e. a string that starts
with ``sr:`` and holds no glob character (``*``, ``?``, ``[``). That leaves out the hash tags
(``user_tag``: ``{...}``), members and fields (``sequence_member``, ``category_field``,
``outcome_due_member``), SCAN patterns (``*_pattern``) and the shard arithmetic.

A table row starts with the builder's name in the first column; its text names the key pattern
first (``<...>`` placeholders stand for the arguments), then a ``Lifetime:``, its writer and
its reader(s).
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable

import pytest

from streamrank import keys, outcome_keys

MODULES = [keys, outcome_keys]

BUILDER_COLUMN = re.compile(r"^(=+)\s+(=+)\s+(=+)$")
GLOB = re.compile(r"[*?\[]")


def _sample_args(func: Callable[..., object]) -> list[object]:
    hints = typing.get_type_hints(func)
    args: list[object] = []
    for i, name in enumerate(inspect.signature(func).parameters):
        args.append(37 + i if hints.get(name) is int else f"s{i}x")
    return args


def _key_builders(module: object = keys) -> dict[str, str]:
    """Name -> the key each key builder of ``module`` returns for sample arguments."""
    found = {}
    for name, func in inspect.getmembers(module, inspect.isfunction):
        if name.startswith("_") or func.__module__ != module.__name__:  # type: ignore[attr-defined]
            continue
        if typing.get_type_hints(func).get("return") is not str:
            continue
        key = func(*_sample_args(func))
        if key.startswith(f"{keys.PREFIX}:") and not GLOB.search(key):
            found[name] = key
    return found


def _table_rows(module: object = keys) -> dict[str, str]:
    """Builder name -> the text of its row in the module docstring's table."""
    lines = (module.__doc__ or "").splitlines()
    rules = [i for i, line in enumerate(lines) if BUILDER_COLUMN.match(line)]
    assert len(rules) == 3, "the keys table needs a top rule, a header rule and a bottom rule"
    width = len(BUILDER_COLUMN.match(lines[rules[0]]).group(1))  # type: ignore[union-attr]
    rows: dict[str, list[str]] = {}
    current: list[str] = []
    for line in lines[rules[1] + 1 : rules[2]]:
        name = line[:width].strip()
        if name:
            assert name not in rows, f"{name} has two rows"
            current = rows[name] = []
        current.append(line[width:].strip())
    return {name: " ".join(text) for name, text in rows.items()}


def _pattern(row: str) -> re.Pattern[str]:
    first = re.search(r"``([^`]+)``", row)
    assert first, f"the row does not start with its key: {row[:60]!r}"
    parts = re.split(r"<[^>]+>", first.group(1))
    return re.compile(r"[^:{}]+".join(re.escape(p) for p in parts))


def test_the_rule_finds_the_builders_it_should() -> None:
    builders = _key_builders() | _key_builders(outcome_keys)
    assert {"sequence", "embedding_bucket", "group_members", "rollout_lease"} <= set(builders)
    assert outcome_keys.PREFIX == keys.PREFIX and outcome_keys.FIELD_SEP == keys.FIELD_SEP
    assert keys.rollout_lease is outcome_keys.rollout_lease  # re-exported
    assert not {"user_tag", "sequence_member", "outcome_due_member", "user_keys_pattern"} & set(
        builders
    )


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_key_builder_has_a_row_and_every_row_a_builder(module: object) -> None:
    builders, rows = _key_builders(module), _table_rows(module)
    missing = sorted(set(builders) - set(rows))
    stale = sorted(set(rows) - set(builders))
    assert not missing, f"key builders missing from the keys.py docstring table: {missing}"
    assert not stale, f"rows of the keys.py docstring table that build no key: {stale}"


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_each_row_names_its_key_lifetime_writer_and_reader(module: object) -> None:
    builders = _key_builders(module)
    for name, row in _table_rows(module).items():
        assert _pattern(row).fullmatch(builders[name]), f"{name}: row key != {builders[name]}"
        assert "Lifetime:" in row, f"{name}: the row says nothing of its lifetime"
        assert re.search(r"\bWriters?\b", row), f"{name}: the row names no writer"
        assert re.search(r"\b[Rr]eaders?\b", row), f"{name}: the row names no reader"
