"""Child processes of the tests, ended on every path.

- `async with child(*argv) as process:` an asyncio subprocess (Python children get
  `PYTHONFAULTHANDLER=1`); on the way out, whatever happened in the block, it is killed if
  still running and reaped, and its pipes are closed.
- `await finished(process, what=..., timeout=...)`: its output once it exits; if it has not
  exited in time, it is sent SIGABRT (a Python child then writes the stack of each of its
  threads) and the test fails with what it wrote, instead of leaving it running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from .waits import BOUND

ROOT = Path(__file__).resolve().parents[1]
PIPE = asyncio.subprocess.PIPE

REAP_BOUND = 10.0
"""Longest wait for a killed child to be reaped (and its pipes drained)."""


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment), with stacks dumped on SIGABRT."""
    chosen = dict(os.environ if env is None else env)
    chosen["PYTHONFAULTHANDLER"] = "1"
    return chosen


@contextlib.asynccontextmanager
async def child(
    *argv: str,
    stdin: int | None = asyncio.subprocess.DEVNULL,
    stdout: int | None = PIPE,
    stderr: int | None = PIPE,
    env: Mapping[str, str] | None = None,
    cwd: str | Path = ROOT,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A child process running `argv` (`python` for this interpreter) for the block."""
    program = sys.executable if argv[0] == "python" else argv[0]
    process = await asyncio.create_subprocess_exec(
        program, *argv[1:], stdin=stdin, stdout=stdout, stderr=stderr, env=child_env(env), cwd=cwd
    )
    try:
        yield process
    finally:
        await ended(process)


async def ended(process: asyncio.subprocess.Process) -> None:
    """Kill `process` if it still runs, reap it and close its pipes (bounded)."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    if process.stdin is not None:
        process.stdin.close()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(REAP_BOUND):
            await process.communicate()
    transport = getattr(process, "_transport", None)
    if transport is not None:
        transport.close()


async def finished(
    process: asyncio.subprocess.Process, *, what: str, timeout: float = BOUND * 3
) -> tuple[bytes, bytes]:
    """Its standard output and error once it has exited (stdin is closed first)."""
    try:
        async with asyncio.timeout(timeout):
            return await process.communicate()
    except TimeoutError:
        pass
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGABRT)
    out, err = b"", b""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(REAP_BOUND):
            out, err = await process.communicate()
    raise AssertionError(
        f"{what}: still running after {timeout:g}s (pid {process.pid}); it was sent SIGABRT. "
        f"Its output:\n{out.decode(errors='replace')}\n"
        f"Its standard error (with its threads' stacks, for a Python child):\n"
        f"{err.decode(errors='replace')}"
    )
