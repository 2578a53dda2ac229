"""The package's module graph in figures: modules and lines per folder, import edges, the
longest chain of imports, and any circle.

    python -m tests.architecture_figures            # the figures of aiolock/
    python -m tests.architecture_figures --json     # the same, as one JSON object

Every import counts (at the top of a module, inside a function, for type checking only). A
module is a file; a package's `__init__.py` is the module named by its folder. Read before
and after a change of the package's shape, to see what it did to the graph.
"""

# ruff: noqa: T201  (a command whose output is its figures)
from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import json
import sys
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "aiolock"
BUDGET = 700
"""Lines a module should stay within: those over it are listed (a budget, not a wall)."""


def module_of(path: Path, root: Path) -> str:
    """`path`'s module name under `root`: "_lua/lock", "cli" for cli/__init__.py."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return "/".join(parts) or "__init__"


def _resolve(root: Path, parts: list[str]) -> str | None:
    """The module that the dotted `parts` (below the package) name, if any."""
    if not parts:
        return "__init__"
    path = root.joinpath(*parts)
    if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
        return "/".join(parts)
    return None


def imports_of(path: Path, root: Path) -> set[str]:
    """The package's modules that the module at `path` imports, anywhere in it."""
    package = root.name
    here = list(path.relative_to(root).parent.parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == package:
                    found.add(_longest(root, parts[1:]))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != package:
                    continue
                base = parts[1:]
            else:
                up = node.level - 1
                if up > len(here):
                    continue
                base = here[: len(here) - up] + (node.module.split(".") if node.module else [])
            for alias in node.names:  # `from .pkg import module` names a module
                sub = _resolve(root, [*base, alias.name])
                found.add(sub if sub is not None else _longest(root, base))
    found.discard(module_of(path, root))
    return found


def _longest(root: Path, parts: list[str]) -> str:
    """The deepest module that a prefix of `parts` names."""
    for end in range(len(parts), 0, -1):
        module = _resolve(root, parts[:end])
        if module is not None:
            return module
    return "__init__"


def graph_of(root: Path) -> dict[str, set[str]]:
    """module -> the modules it imports, for every module under `root`."""
    return {module_of(p, root): imports_of(p, root) for p in sorted(root.rglob("*.py"))}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of imports, found once."""
    found: list[list[str]] = []
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of imports (module -> what it imports -> ...), if no circle."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))

    @functools.cache
    def from_(module: str) -> tuple[str, ...]:
        best: tuple[str, ...] = ()
        for target in sorted(graph.get(module, ())):
            chain = from_(target)
            if len(chain) > len(best):
                best = chain
        return (module, *best)

    best: tuple[str, ...] = ()
    for module in sorted(graph):
        if len(chain := from_(module)) > len(best):
            best = chain
    return list(best)


def folder_of(path: Path, root: Path) -> str:
    """The folder a module's file stands in ("." for the package's own level)."""
    return path.relative_to(root).parent.as_posix()


@dataclasses.dataclass(frozen=True)
class Figures:
    modules: int
    lines: int
    folders: dict[str, tuple[int, int]]  # folder -> (modules, lines)
    import_edges: int
    edges_between_folders: int
    longest_chain: list[str]
    circles: list[list[str]]
    largest_modules: list[tuple[str, int]]
    over_budget: list[tuple[str, int]]


def figures(root: Path) -> Figures:
    graph = graph_of(root)
    paths = {module_of(p, root): p for p in root.rglob("*.py")}
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in paths.items()}
    folder = {m: folder_of(p, root) for m, p in paths.items()}
    modules: Counter[str] = Counter()
    folder_lines: Counter[str] = Counter()
    for module in graph:
        modules[folder[module]] += 1
        folder_lines[folder[module]] += lines[module]
    found = circles(graph)
    return Figures(
        modules=len(graph),
        lines=sum(lines.values()),
        folders={f: (modules[f], folder_lines[f]) for f in sorted(modules)},
        import_edges=sum(len(targets) for targets in graph.values()),
        edges_between_folders=sum(
            1 for m, targets in graph.items() for t in targets if folder[m] != folder[t]
        ),
        longest_chain=[] if found else longest_chain(graph),
        circles=found,
        largest_modules=sorted(lines.items(), key=lambda item: -item[1])[:5],
        over_budget=sorted(
            ((m, n) for m, n in lines.items() if n > BUDGET), key=lambda item: -item[1]
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--root", type=Path, default=PACKAGE, help="the package (aiolock/)")
    args = parser.parse_args(argv)
    found = figures(args.root)
    if args.json:
        print(json.dumps(dataclasses.asdict(found), indent=2))
        return 0
    print(f"{found.modules} modules, {found.lines} lines")
    print(f"  {'folder':<24} {'modules':>7} {'lines':>7}")
    for folder, (count, size) in found.folders.items():
        print(f"  {folder:<24} {count:>7} {size:>7}")
    print(f"import edges: {found.import_edges} ({found.edges_between_folders} between folders)")
    print(f"longest chain of imports: {len(found.longest_chain)} modules")
    print("  " + " -> ".join(found.longest_chain))
    print(f"circles: {len(found.circles)}")
    for circle in found.circles:
        print("  " + " -> ".join(circle))
    largest = ", ".join(f"{module} ({size})" for module, size in found.largest_modules)
    print(f"largest modules: {largest}")
    over = ", ".join(f"{module} ({size})" for module, size in found.over_budget) or "none"
    print(f"over the {BUDGET}-line budget: {over}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
