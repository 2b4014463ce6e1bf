"""Artifacts load without executing code: no pickle-based load anywhere in the engine.

Model weights and embedding tables are safetensors (plain tensors, no code); this test fails
as soon as any module of ours calls a loader that unpickles (``pickle``/``torch.load``/
``numpy.load(allow_pickle=True)``/``joblib``/...), whatever the file it would read."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("streamrank", "streams", "scoring", "schemas")
# Modules whose loaders run code from the bytes they read.
UNSAFE_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "dill",
    "cloudpickle",
    "joblib",
    "shelve",
    "marshal",
}
# Callables that unpickle: (module alias root, attribute).
UNSAFE_CALLS = {
    ("torch", "load"),
    ("torch", "jit"),
    ("pd", "read_pickle"),
    ("pandas", "read_pickle"),
}


def offences(source: str, name: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            found += [f"{name}:{node.lineno} import {a.name}" for a in node.names
                      if a.name.split(".")[0] in UNSAFE_MODULES]  # fmt: skip
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in UNSAFE_MODULES:
                found.append(f"{name}:{node.lineno} from {node.module} import ...")
            if node.module == "torch" and any(a.name == "load" for a in node.names):
                found.append(f"{name}:{node.lineno} from torch import load")
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and (func.value.id, func.attr) in UNSAFE_CALLS
            ):
                found.append(f"{name}:{node.lineno} {func.value.id}.{func.attr}(...)")
            for kw in node.keywords:
                if kw.arg == "allow_pickle" and not (
                    isinstance(kw.value, ast.Constant) and kw.value.value is False
                ):
                    found.append(f"{name}:{node.lineno} allow_pickle=...")
    return found


def test_no_module_of_ours_unpickles() -> None:
    sources = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert len(sources) > 50
    found = [o for p in sources for o in offences(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "pickle-based loads (use safetensors):\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_pickle_load() -> None:
    """The scan is not vacuous: every way in is caught."""
    for snippet in ("import pickle", "from joblib import load", "import torch\ntorch.load(f)",
                    "import numpy as np\nnp.load(f, allow_pickle=True)",
                    "from torch import load", "import dill.settings"):  # fmt: skip
        assert offences(snippet, "x.py"), snippet
    assert not offences("import numpy as np\nnp.load(f, allow_pickle=False)", "x.py")
    assert not offences("from safetensors.torch import load", "x.py")
