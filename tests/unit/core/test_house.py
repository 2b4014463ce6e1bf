"""The layout's rules that import-linter does not state: no import cycle between any two of our
modules, small modules and small functions (see the team guide)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[3]
FLOORS = ("streamrank", "schemas", "streams", "scoring", "workbench")  # bottom to top
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def strongly_connected(graph: grimp.ImportGraph) -> list[set[str]]:
    """Tarjan's strongly connected components of more than one module (each one is a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(component)

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # Function-level imports count: a cycle hidden inside a function is still a cycle.
    return grimp.build_graph(*FLOORS, cache_dir=None)


def test_no_import_cycle(graph: grimp.ImportGraph) -> None:
    cycles = strongly_connected(graph)
    assert cycles == [], f"modules that import each other in a loop: {cycles}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    g = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        g.add_import(importer=a, imported=b)
    assert strongly_connected(g) == [{"p.a", "p.b", "p.c"}]


def test_every_import_points_down_a_floor(graph: grimp.ImportGraph) -> None:
    upward = [
        (importer, imported)
        for lower, floor in enumerate(FLOORS)
        for importer in graph.find_descendants(floor) | {floor}
        for imported in graph.find_modules_directly_imported_by(importer)
        if imported.split(".")[0] in FLOORS[lower + 1 :]
    ]
    assert upward == []


def sources() -> Iterator[Path]:
    for floor in FLOORS:
        yield from sorted((ROOT / floor).rglob("*.py"))


def is_declarative_table(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Most of the body (85% of its lines) assigns one call result per statement, e.g. a metric
    family per row: long, but one table, not logic."""

    def lines(node: ast.stmt) -> int:
        return (node.end_lineno or node.lineno) - node.lineno + 1

    rows = sum(
        lines(statement)
        for statement in function.body
        if isinstance(statement, ast.Assign | ast.AnnAssign)
        and isinstance(statement.value, ast.Call)
    )
    return rows >= 0.85 * sum(lines(statement) for statement in function.body)


def test_modules_are_small() -> None:
    large = {
        str(path.relative_to(ROOT)): n
        for path in sources()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert large == {}, f"modules over {MAX_MODULE_LINES} lines: split them by responsibility"


def test_functions_are_small() -> None:
    long: dict[str, int] = {}
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES and not is_declarative_table(node):
                long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines: split them"


def test_declarative_table_rule() -> None:
    rows = "".join(f"    self.m{i} = Counter(\n        'm{i}',\n    )\n" for i in range(10))
    table = ast.parse(f"def f(self):\n    r = self.registry\n{rows}")
    logic = ast.parse("def f(self):\n    self.a = C(1)\n    if self.a:\n        return 1\n")
    assert is_declarative_table(table.body[0])  # type: ignore[arg-type]
    assert not is_declarative_table(logic.body[0])  # type: ignore[arg-type]
