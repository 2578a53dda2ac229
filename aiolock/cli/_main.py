"""`main`: the arguments parsed, the command run, its failures turned into exit codes and
one-line messages."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeAlias

from .._transport.backend import Backend
from ..errors import BackendError, ConfigError
from ._connection import DEFAULT_URL, redact
from ._errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, UsageError, error
from ._flash_sale import DemoError
from ._parser import build_parser
from ._text import printable

_HAVE_RICH: Final = importlib.util.find_spec("rich") is not None


def main(argv: list[str] | None = None) -> int:
    """Run the `aiolock` command line with `argv` (default: `sys.argv[1:]`).

    Returns:
        The exit code: 0 ok, 1 operation failed, 2 usage or connection error,
        130 interrupted.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or argparse's own usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not _HAVE_RICH:  # pragma: no cover - tested in a subprocess without rich
        error('the aiolock command line needs rich: pip install "aiolock-redis[cli]"')
        return EXIT_USAGE
    url = args.url or os.environ.get("REDIS_URL") or None
    try:
        return asyncio.run(_commands()[args.command](args, url))
    except KeyboardInterrupt:
        error("interrupted")
        return EXIT_INTERRUPTED
    except UsageError as exc:
        error(str(exc))
        return EXIT_USAGE
    except BackendError as exc:
        where = redact(url or DEFAULT_URL)
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        detail = printable(" ".join(str(cause).split()) or type(cause).__name__)
        if Backend.refused(exc):
            error(f"Redis at {where} refused the command: {detail}")
            return EXIT_FAILED
        error(f"cannot talk to Redis at {where}: {detail}")
        return EXIT_USAGE
    except DemoError as exc:
        error(f"demo failed: {exc}")
        return EXIT_FAILED
    except (ConfigError, ValueError) as exc:
        error(str(exc))
        return EXIT_USAGE


Command: TypeAlias = Callable[[argparse.Namespace, str | None], Coroutine[Any, Any, int]]
"""A command: its parsed arguments and the URL given (None: the default) to its exit code."""


def _commands() -> dict[str, Command]:
    """The commands by name. They print with rich, so they are imported once `main` has
    found rich installed (without it, `main` still answers `--help` and names the extra)."""
    from ._demo_command import demo_command  # noqa: PLC0415
    from ._inspection import ls_command, show_command, stats_command, watch_command  # noqa: PLC0415
    from ._maintenance import doctor_command, release_command  # noqa: PLC0415

    return {
        "ls": ls_command,
        "show": show_command,
        "release": release_command,
        "watch": watch_command,
        "stats": stats_command,
        "doctor": doctor_command,
        "demo": demo_command,
    }
