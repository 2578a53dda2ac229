"""How the command line ends: its exit codes, a usage error, a one-line message on stderr."""

from __future__ import annotations

import sys
from typing import Final

EXIT_OK: Final = 0
"""The command did what it was asked."""
EXIT_FAILED: Final = 1
"""The operation failed: the demo's invariant, nothing released, no such lock, a problem
found by `doctor`."""
EXIT_USAGE: Final = 2
"""Bad usage, or Redis could not be reached (or is not Redis)."""
EXIT_INTERRUPTED: Final = 130
"""Interrupted (Ctrl-C, SIGINT): 128 + 2, as a shell reports it."""


class UsageError(Exception):
    """A mistake on the command line: one line on stderr, exit code 2."""


def error(message: str) -> None:
    sys.stderr.write(f"aiolock: {message}\n")
    sys.stderr.flush()
