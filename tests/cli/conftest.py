"""Helpers for the command-line tests: run `aiolock.cli.main` in-process, unique names."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from aiolock import Lease, cli

from ..support import waits


@pytest.fixture(autouse=True)
def no_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The output is that of a pipe, whatever the environment says of a terminal (pytest-xdist's
    workers, for one, set COLUMNS=80)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    """`run("ls", "--json")`: main() in this thread (the test must not run an event loop)."""

    def run(*argv: str) -> Run:
        capsys.readouterr()
        code = cli.main(list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


@pytest.fixture
def arun(capsys: pytest.CaptureFixture[str]) -> Callable[..., Awaitable[Run]]:
    """`await arun("ls")`: main() in a thread, while this test's event loop holds locks."""

    async def arun(*argv: str) -> Run:
        capsys.readouterr()
        code = await asyncio.to_thread(cli.main, list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return arun


@pytest.fixture
def tag() -> str:
    """A prefix for this test's lock names (no glob characters, unlike `name`)."""
    return f"cli-{uuid.uuid4().hex[:10]}"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def eventually(
    predicate: Callable[[], Awaitable[bool]], *, what: str, timeout: float = 10.0
) -> None:
    """Wait until `predicate()` holds (it reads state from Redis), or fail naming `what`."""
    await waits.eventually(predicate, what=what, timeout=timeout, interval=0.01)


async def release_all(leases: list[Lease], waiters: list[asyncio.Task[Lease]]) -> None:
    """Release `leases`, then each waiter's lease as it gets in (a permit, a side freed
    above: the read-write lock's writers first, then its readers)."""
    for lease in leases:
        await lease.release()
    for waiter in asyncio.as_completed(waiters):
        await (await waits.within(waiter, what="a waiter to get in")).release()
