"""The package's name on the index, `aiolock-redis` (the import name is `aiolock`; the
name `aiolock` there is another project's): in its metadata, its own extras, and every
install line the project shows its users."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import aiolock
import aiolock._version

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "aiolock-redis"


def test_the_installed_distribution_is_aiolock_redis_and_provides_aiolock() -> None:
    assert importlib.metadata.version(DISTRIBUTION) == aiolock.__version__
    assert aiolock._version.DISTRIBUTION == DISTRIBUTION
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["name"] == DISTRIBUTION
    # The wheel ships the package `aiolock` (not the `aiolock_redis` the name would imply).
    assert pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["aiolock"]
    for extra, requirements in project["optional-dependencies"].items():
        for requirement in requirements:
            name = re.split(r"[\[<>=;! ]", requirement, maxsplit=1)[0]
            assert name != "aiolock", f"extra {extra!r} asks for {requirement!r}"


def shown_files() -> list[Path]:
    """What users read: the package, the examples, the docs, the README."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in ("aiolock", "examples"):
        found += sorted((ROOT / folder).rglob("*.py"))
    return found


def test_every_install_line_names_the_distribution() -> None:
    """`pip install aiolock` or `"aiolock[cli]"` would install the other project."""
    wrong = re.compile(r"""(pip install\s+(-e\s+)?["']?aiolock(?![-\w])|["']aiolock\[)""")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in shown_files()
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if wrong.search(line)
    ]
    assert found == []


@pytest.mark.parametrize("argv", [["--version"]])
def test_the_command_names_its_distribution(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aiolock", *argv],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"aiolock {aiolock.__version__} ({DISTRIBUTION})"
