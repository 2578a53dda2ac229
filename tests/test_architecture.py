"""The package's shape, as ARCHITECTURE.md draws it: its layers, read from the imports, and
the sizes of its modules (every one) and of the core's functions.

Layers, bottom to top: data -> I/O -> engine -> primitives -> CLI and integrations. A module
imports modules of its own layer or of layers below it, never above (every import counts:
at the top, inside a function, or for type checking only), and the imports make no circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aiolock"

DATA, IO, ENGINE, PRIMITIVES, TOP = range(5)
LAYER_NAMES = ("data", "I/O", "engine", "primitives", "CLI and integrations")

LAYERS: dict[str, int] = {
    # Data and pure decisions: no connection, no task.
    "errors": DATA,
    "_version": DATA,
    "_layout": DATA,
    "_retry": DATA,
    "_renewal": DATA,
    "_config": DATA,
    "_options": DATA,
    "_info": DATA,
    "_events": DATA,
    "_cancel": DATA,
    "_guard": DATA,
    "_blocks": DATA,
    "_settle": DATA,
    "_scripts": DATA,
    "_lease_scripts": DATA,
    "_hash_scripts": DATA,
    "_permit_index": DATA,
    "_semaphore_scripts": DATA,
    "_redlock_scripts": DATA,
    "_rwlock_scripts": DATA,
    "_election_scripts": DATA,
    "_fencing_scripts": DATA,
    "_shard_scripts": DATA,
    "_acl": DATA,
    "_queue": DATA,
    "_holdstats": DATA,
    # I/O: the client libraries, the transports, the per-client runtime, the lease.
    "_clients": IO,
    "_pubsub": IO,
    "_transport": IO,
    "_transport_direct": IO,
    "_transport_sentinel": IO,
    "_transport_cluster": IO,
    "_quorum": IO,
    "_quorum_pubsub": IO,
    "_cluster_pubsub": IO,
    "_backend": IO,
    "_lease": IO,
    "_watchdog": IO,
    "_notifier": IO,
    "_eager": IO,
    "_runtime": IO,
    # The engine every leased primitive shares.
    "_primitive": ENGINE,
    "_release": ENGINE,
    "_granting": ENGINE,
    "_engine": ENGINE,
    # The primitives, and what reads or composes them.
    "_lock": PRIMITIVES,
    "_semaphore": PRIMITIVES,
    "_redlock": PRIMITIVES,
    "_rwlock": PRIMITIVES,
    "_election": PRIMITIVES,
    "_leader": PRIMITIVES,
    "_multilock": PRIMITIVES,
    "_inspect": PRIMITIVES,
    "_locked": PRIMITIVES,
    "_once": PRIMITIVES,
    "_fencing": PRIMITIVES,
    "_shutdown": PRIMITIVES,
    "_glue": PRIMITIVES,
    # The leaves: the public package, the command line, the integrations, testing helpers.
    "__init__": TOP,
    "__main__": TOP,
    "cli": TOP,
    "_demo": TOP,
    "_doctor": TOP,
    "aiohttp": TOP,
    "fastapi": TOP,
    "opentelemetry": TOP,
    "prometheus": TOP,
    "testing": TOP,
    "sync": TOP,
}
"""Every module of the package, by the layer it belongs to (a subpackage as one module)."""

CORE = (
    "_primitive",
    "_release",
    "_granting",
    "_engine",
    "_lease",
    "_queue",
    "_notifier",
    "_renewal",
    "_watchdog",
    "_clients",
    "_transport",
    "_transport_direct",
    "_transport_sentinel",
    "_transport_cluster",
    "_backend",
    "_quorum",
    "_quorum_pubsub",
    "_cluster_pubsub",
)
"""The engine, lease, waiting, renewal and backend modules: kept small enough to read."""

MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80


def unit_of(path: Path, root: Path) -> str:
    """The layer unit of a module file: its name, or its subpackage's."""
    parts = path.relative_to(root).with_suffix("").parts
    return parts[0]


def imported_units(path: Path, root: Path) -> Iterator[tuple[str, int]]:
    """The package's units that the module at `path` imports (anywhere in it), with the
    line of each import."""
    package = root.name
    tree = ast.parse(path.read_text(encoding="utf-8"))
    depth = len(path.relative_to(root).parts) - 1  # 0 for a module of the package itself
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == package and len(parts) > 1:
                    yield parts[1], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != package:
                    continue
                rest = parts[1:]
            else:
                if node.level - 1 > depth:
                    continue  # pragma: no cover - above the package
                base = list(path.relative_to(root).parent.parts)[: depth - (node.level - 1)]
                rest = [*base, *(node.module.split(".") if node.module else [])]
            if rest:
                yield rest[0], node.lineno
            else:  # `from . import x`: a module, or a name of the package's __init__
                for alias in node.names:
                    known = (root / f"{alias.name}.py").exists() or (root / alias.name).is_dir()
                    yield (alias.name if known else "__init__"), node.lineno


def import_graph(root: Path) -> dict[str, dict[str, list[str]]]:
    """unit -> {imported unit -> [where]}, for every module of the package under `root`."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(root.rglob("*.py")):
        unit = unit_of(path, root)
        edges = graph.setdefault(unit, {})
        for target, line in imported_units(path, root):
            if target != unit:
                edges.setdefault(target, []).append(f"{path.relative_to(root)}:{line}")
    return graph


def layer_violations(root: Path, layers: dict[str, int]) -> list[str]:
    """Every import that runs up the layers, and every module without a layer."""
    problems = []
    graph = import_graph(root)
    for unit, edges in sorted(graph.items()):
        if unit not in layers:
            problems.append(f"{unit} has no layer in tests/test_architecture.py's LAYERS")
            continue
        for target, where in sorted(edges.items()):
            if target not in layers:
                problems.append(f"{unit} imports {target}, which has no layer: {where[0]}")
                continue
            if layers[target] > layers[unit]:
                problems.append(
                    f"{unit} ({LAYER_NAMES[layers[unit]]}) imports {target} "
                    f"({LAYER_NAMES[layers[target]]}), a layer above it: {', '.join(where)}"
                )
    return problems


def cycles(root: Path) -> list[list[str]]:
    """The circles in the import graph (each found once, from its first unit)."""
    graph = import_graph(root)
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(unit: str) -> None:
        state[unit] = 1
        path.append(unit)
        for target in sorted(graph.get(unit, {})):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[unit] = 2

    for unit in sorted(graph):
        if unit not in state:
            visit(unit)
    return found


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


def size_violations(root: Path, modules: tuple[str, ...]) -> list[str]:
    problems = []
    for name in modules:
        path = root / f"{name}.py"
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            problems.append(f"{name}.py has {lines} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = body_lines(node)
                if length > MAX_FUNCTION_LINES:
                    problems.append(
                        f"{name}.py:{node.lineno} {node.name}() has a body of {length} lines "
                        f"(at most {MAX_FUNCTION_LINES})"
                    )
    return problems


def test_every_module_has_a_layer() -> None:
    units = set(import_graph(PACKAGE))
    assert units <= set(LAYERS), sorted(units - set(LAYERS))
    assert set(LAYERS) <= units, f"no such module: {sorted(set(LAYERS) - units)}"


def test_nothing_imports_upward() -> None:
    assert layer_violations(PACKAGE, LAYERS) == []


def test_the_imports_make_no_circle() -> None:
    assert cycles(PACKAGE) == []


def test_the_core_modules_and_functions_are_small() -> None:
    assert size_violations(PACKAGE, CORE) == []


def test_no_module_is_over_the_size_limit() -> None:
    """Every module of the package, a subpackage's (the command line's) included."""
    too_long = [
        f"{path.relative_to(PACKAGE)} has {lines} lines (at most {MAX_MODULE_LINES})"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert too_long == []


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A small package shaped like aiolock: `_layout` (data) <- `_backend` (I/O)."""
    root = tmp_path / "aiolock"
    root.mkdir()
    (root / "__init__.py").write_text("from ._backend import Backend as Backend\n")
    (root / "_layout.py").write_text("X = 1\n")
    (root / "_backend.py").write_text("from ._layout import X\n\n\nclass Backend:\n    x = X\n")
    return root


def test_an_upward_import_is_found(planted: Path) -> None:
    layers = {"__init__": TOP, "_layout": DATA, "_backend": IO}
    assert layer_violations(planted, layers) == []
    (planted / "_layout.py").write_text(
        "X = 1\n\n\ndef f() -> object:\n    from . import _backend\n\n    return _backend\n"
    )
    (problem,) = layer_violations(planted, layers)
    assert problem.startswith("_layout (data) imports _backend (I/O), a layer above it")


def test_a_circle_is_found(planted: Path) -> None:
    assert cycles(planted) == []
    (planted / "_layout.py").write_text("from aiolock._backend import Backend\n")
    assert cycles(planted) == [["_backend", "_layout", "_backend"]]


def test_a_long_function_and_a_long_module_are_found(planted: Path) -> None:
    assert size_violations(planted, ("_backend",)) == []
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES + 1))
    (planted / "_backend.py").write_text(f'def f() -> None:\n    """Doc."""\n{body}')
    (problem,) = size_violations(planted, ("_backend",))
    assert f"f() has a body of {MAX_FUNCTION_LINES + 1} lines" in problem
    (planted / "_backend.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (problem,) = size_violations(planted, ("_backend",))
    assert f"has {MAX_MODULE_LINES + 1} lines" in problem


def test_the_figures_read_the_graph_of_a_package(planted: Path) -> None:
    """`python -m tests.architecture_figures` on a small package: its modules, edges,
    chain and circles."""
    from .architecture_figures import figures

    found = figures(planted)
    assert (found.modules, found.import_edges, found.circles) == (3, 2, [])
    assert found.longest_chain == ["__init__", "_backend", "_layout"]
    (planted / "_layout.py").write_text("from ._backend import Backend\n")
    assert figures(planted).circles == [["_backend", "_layout", "_backend"]]
