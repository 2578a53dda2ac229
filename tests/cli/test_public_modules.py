"""The public modules added with the command line keep the package's export rules."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import aiolock


@pytest.mark.parametrize(
    "module",
    [
        "aiolock.cli",
        "aiolock.prometheus",
        "aiolock.opentelemetry",
        "aiolock.fastapi",
        "aiolock.aiohttp",
    ],
)
def test_public_module_all_is_a_sorted_tuple(module: str) -> None:
    loaded = importlib.import_module(module)
    names = loaded.__all__
    assert isinstance(names, tuple)
    assert list(names) == sorted(names)
    for name in names:
        assert hasattr(loaded, name)


def test_importing_aiolock_imports_no_extra() -> None:
    code = (
        "import sys, aiolock\n"
        "extras = ('rich', 'prometheus_client', 'aiolock.cli', 'aiolock.prometheus',"
        " 'aiolock.opentelemetry', 'fastapi', 'starlette', 'aiohttp', 'aiolock.fastapi',"
        " 'aiolock.aiohttp')\n"
        "print(sorted(m for m in extras if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout.strip() == "[]"
    assert {"HoldStats", "hold_stats"} <= set(aiolock.__all__)
