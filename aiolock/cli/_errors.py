"""How the command line ends: its exit codes, a usage error, a one-line message on stderr."""

from __future__ import annotations

import sys
from typing import Final

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
"""The operation failed: the demo's invariant, nothing released, no such lock, a problem
found by `doctor`."""
EXIT_USAGE: Final = 2
"""Bad usage, or Redis could not be reached (or is not Redis)."""
EXIT_INTERRUPTED: Final = 130


class UsageError(Exception):
    """A mistake on the command line: one line on stderr, exit code 2."""


def error(message: str) -> None:
    sys.stderr.write(f"aiolock: {message}\n")
    sys.stderr.flush()
