"""Counting a child process's own instructions with valgrind's callgrind, over a stretch the
child marks itself: a figure the noise of shared cores hardly moves.

The child runs under `valgrind --tool=callgrind --instr-atstart=no` (`counted`), and calls
`toggle("on")` and `toggle("off")` around the work to count (valgrind does not follow the
processes it starts, such as its servers). Needs `valgrind` and `callgrind_control` on the
PATH (`available`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence


def available() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


def toggle(state: str) -> None:
    """In the child: start ("on") or stop ("off") counting this process's instructions."""
    subprocess.run(
        ["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True
    )


def counted(command: Sequence[str], *, timeout: float = 1800) -> tuple[int, str]:
    """Run `command` (a Python child that toggles the count) under callgrind: the
    instructions counted, and what it printed."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={tmp}/callgrind.out",
                *command,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1)), done.stdout
