"""The package's shape, as ARCHITECTURE.md draws it: its floors, read from the imports, and
the sizes of its functions and modules.

A floor is a folder of the package (or a public module at its top); a module belongs to the
floor of the folder it stands in, so a new file needs no entry here. Floors, bottom to top:
asyncio helpers -> scripts and data layout -> settings and records -> transports -> engine ->
operations -> primitives -> recipes -> public faces -> command line. A module imports modules
of its own floor or of floors below it, never above (every import counts: at the top, inside a
function, or for type checking only), and the imports make no circle, between modules of one
folder included.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

from .architecture_figures import figures, graph_of

PACKAGE = Path(__file__).resolve().parent.parent / "aiolock"

FLOORS: tuple[tuple[str, frozenset[str]], ...] = (
    ("asyncio helpers", frozenset({"_aio"})),
    ("scripts and data layout", frozenset({"_lua"})),
    ("settings and records", frozenset({"_model", "errors", "_version"})),
    ("transports", frozenset({"_transport"})),
    ("engine", frozenset({"_engine"})),
    ("operations", frozenset({"_ops"})),
    ("primitives", frozenset({"_primitives"})),
    ("recipes", frozenset({"_recipes"})),
    (
        "public faces",
        frozenset(
            {"__init__", "aiohttp", "fastapi", "opentelemetry", "prometheus", "sync", "testing"}
        ),
    ),
    ("command line", frozenset({"cli", "__main__"})),
)
"""Every folder and top-level module of the package, by the floor it stands on."""

FLOOR: dict[str, int] = {unit: n for n, (_, units) in enumerate(FLOORS) for unit in units}

MODULE_BUDGET = 700
"""Lines a module should stay within: one over it is reported (a warning in the run)."""
MODULE_CEILING = 2 * MODULE_BUDGET
"""Lines no module may pass: at twice its budget a module does two jobs."""
MAX_FUNCTION_LINES = 80
CODE_FOLDERS = ("_aio", "_model", "_transport", "_engine", "_ops", "_primitives", "_recipes")
"""The folders whose functions are held to MAX_FUNCTION_LINES (`_lua`'s build script text)."""


class OverBudget(UserWarning):
    """A module is longer than the budget: a candidate for a split at a seam."""


def unit_of(module: str) -> str:
    """The floor unit of a module ("_lua/lock" -> "_lua", "errors" -> "errors")."""
    return module.split("/", maxsplit=1)[0]


def floor_violations(root: Path, floors: dict[str, int]) -> list[str]:
    """Every import that runs up the floors, and every unit that stands on no floor."""
    problems = []
    for module, targets in sorted(graph_of(root).items()):
        unit = unit_of(module)
        if unit not in floors:
            problems.append(f"{module}: {unit} is on no floor of tests/test_architecture.py")
            continue
        for target in sorted(targets):
            above = unit_of(target)
            if above in floors and floors[above] > floors[unit]:
                problems.append(
                    f"{module} ({FLOORS[floors[unit]][0]}) imports {target} "
                    f"({FLOORS[floors[above]][0]}), a floor above it"
                )
    return problems


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, its docstring left out."""
    body = function.body
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        body = body[1:]
    if not body:
        return 0
    end = body[-1].end_lineno
    assert end is not None
    return end - body[0].lineno + 1


def long_functions(root: Path) -> list[str]:
    """Every function of CODE_FOLDERS whose body is over MAX_FUNCTION_LINES."""
    problems = []
    for path in sorted(p for folder in CODE_FOLDERS for p in (root / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = body_lines(node)
                if length > MAX_FUNCTION_LINES:
                    problems.append(
                        f"{path.relative_to(root)}:{node.lineno} {node.name}() has a body of "
                        f"{length} lines (at most {MAX_FUNCTION_LINES})"
                    )
    return problems


def module_sizes(root: Path, limit: int) -> list[str]:
    """Every module of the package longer than `limit` lines."""
    return [
        f"{path.relative_to(root)} has {lines} lines (budget {MODULE_BUDGET})"
        for path in sorted(root.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > limit
    ]


def test_every_folder_stands_on_a_floor() -> None:
    units = {unit_of(module) for module in graph_of(PACKAGE)}
    assert units <= set(FLOOR), sorted(units - set(FLOOR))
    assert set(FLOOR) <= units, f"no such folder or module: {sorted(set(FLOOR) - units)}"


def test_nothing_imports_upward() -> None:
    assert floor_violations(PACKAGE, FLOOR) == []


def test_the_imports_make_no_circle() -> None:
    assert figures(PACKAGE).circles == []


def test_every_function_is_short() -> None:
    assert long_functions(PACKAGE) == []


@pytest.mark.filterwarnings("always::tests.test_architecture.OverBudget")
def test_module_sizes_are_reported_against_their_budget() -> None:
    """A module over the budget is reported as a warning in the run; one past the ceiling
    fails."""
    for problem in module_sizes(PACKAGE, MODULE_BUDGET):
        warnings.warn(problem, OverBudget, stacklevel=1)
    assert module_sizes(PACKAGE, MODULE_CEILING) == []


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A small package shaped like aiolock: `_lua/layout` <- `_transport/backend`."""
    root = tmp_path / "aiolock"
    for folder in ("_lua", "_transport"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text('"""A floor."""\n')
    (root / "__init__.py").write_text("from ._transport.backend import Backend as Backend\n")
    (root / "_lua" / "layout.py").write_text("X = 1\n")
    (root / "_transport" / "backend.py").write_text(
        "from .._lua.layout import X\n\n\nclass Backend:\n    x = X\n"
    )
    return root


PLANTED_FLOORS = {"_lua": 1, "_transport": 3, "__init__": 8}


def test_an_upward_import_is_found(planted: Path) -> None:
    assert floor_violations(planted, PLANTED_FLOORS) == []
    (planted / "_lua" / "layout.py").write_text(
        "X = 1\n\n\ndef f() -> object:\n    from .._transport import backend\n\n"
        "    return backend\n"
    )
    (problem,) = floor_violations(planted, PLANTED_FLOORS)
    assert problem == (
        "_lua/layout (scripts and data layout) imports _transport/backend (transports), "
        "a floor above it"
    )


def test_a_type_only_import_counts(planted: Path) -> None:
    (planted / "_lua" / "layout.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        "    from aiolock._transport.backend import Backend\n"
    )
    (problem,) = floor_violations(planted, PLANTED_FLOORS)
    assert problem.startswith("_lua/layout (scripts and data layout) imports _transport/backend")


def test_a_module_on_no_floor_is_found(planted: Path) -> None:
    (planted / "_stray.py").write_text("Y = 2\n")
    assert floor_violations(planted, PLANTED_FLOORS) == [
        "_stray: _stray is on no floor of tests/test_architecture.py"
    ]


def test_a_circle_inside_one_folder_is_found(planted: Path) -> None:
    (planted / "_transport" / "pool.py").write_text("from .backend import Backend\n")
    assert figures(planted).circles == []
    (planted / "_transport" / "backend.py").write_text("from .pool import Backend\n")
    assert figures(planted).circles == [
        ["_transport/backend", "_transport/pool", "_transport/backend"]
    ]


def test_a_long_function_and_a_long_module_are_found(planted: Path) -> None:
    assert long_functions(planted) == []
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES + 1))
    (planted / "_transport" / "backend.py").write_text(f'def f() -> None:\n    """Doc."""\n{body}')
    (problem,) = long_functions(planted)
    assert f"f() has a body of {MAX_FUNCTION_LINES + 1} lines" in problem
    assert module_sizes(planted, MODULE_BUDGET) == []
    (planted / "_lua" / "layout.py").write_text("x = 1\n" * (MODULE_BUDGET + 1))
    assert module_sizes(planted, MODULE_BUDGET) == [
        f"_lua/layout.py has {MODULE_BUDGET + 1} lines (budget {MODULE_BUDGET})"
    ]


def test_the_figures_read_the_graph_of_a_package(planted: Path) -> None:
    """`python -m tests.architecture_figures` on a small package: its modules, edges,
    chain and circles."""
    found = figures(planted)
    assert (found.modules, found.import_edges, found.circles) == (5, 2, [])
    assert found.longest_chain == ["__init__", "_transport/backend", "_lua/layout"]
    assert found.folders == {".": (1, 1), "_lua": (2, 2), "_transport": (2, 6)}
