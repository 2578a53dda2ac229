"""The test suite's servers are the public helpers of `aiolock.testing`; a Redlock's nodes are
several of them, with a client each."""

import contextlib
from collections.abc import AsyncIterator, Iterator

import redis.asyncio

from aiolock.testing import RedisServer, ServerBinary, find_binaries

__all__ = ("RedisServer", "ServerBinary", "clients_of", "find_binaries", "independent_servers")


@contextlib.contextmanager
def independent_servers(binary: ServerBinary, count: int) -> Iterator[list[RedisServer]]:
    """`count` servers of `binary`, each on a port of its own (a Redlock's nodes), every one
    that started stopped at the end."""
    started: list[RedisServer] = []
    try:
        started.extend(RedisServer(binary).start() for _ in range(count))
        yield started
    finally:
        for server in started:
            server.stop()


@contextlib.asynccontextmanager
async def clients_of(servers: list[RedisServer]) -> AsyncIterator[list[redis.asyncio.Redis]]:
    """A client of each server, closed at the end."""
    clients = [redis.asyncio.Redis.from_url(server.url) for server in servers]
    try:
        yield clients
    finally:
        for client in clients:
            await client.aclose()
