"""The test suite's servers are the public helpers of `aiolock.testing`; a Redlock's nodes are
several of them, with a client each; `quorum_calls_ended` waits for the calls a Redlock left
to its slower nodes. The clients several processes would have (`all_closed`), and a
server's clock (`server_ms`, `server_us`)."""

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Protocol, TypeVar

import redis.asyncio
from redis.crc import key_slot

from aiolock._engine.runtime import _runtimes
from aiolock._transport.quorum import Quorum, QuorumBackend
from aiolock.testing import RedisServer, ServerBinary, find_binaries

from .waits import eventually

__all__ = (
    "RedisServer",
    "ServerBinary",
    "all_closed",
    "clients_of",
    "connections_named",
    "find_binaries",
    "independent_servers",
    "quorum_calls_ended",
    "server_ms",
    "server_us",
)


class _Closable(Protocol):
    async def aclose(self) -> None: ...


C = TypeVar("C", bound=_Closable)


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
async def all_closed(made: list[C]) -> AsyncIterator[list[C]]:
    """`made` (clients, as several processes would have: each its own connections,
    notifier and wait queues), every one closed at the end."""
    try:
        yield made
    finally:
        for client in made:
            await client.aclose()


def clients_of(
    servers: list[RedisServer],
) -> contextlib.AbstractAsyncContextManager[list[redis.asyncio.Redis]]:
    """A client of each server, closed at the end."""
    return all_closed([redis.asyncio.Redis.from_url(server.url) for server in servers])


async def server_us(client: redis.asyncio.Redis) -> int:
    """The server's clock (TIME), in µs (the unit of a fencing token read off the clock)."""
    seconds, micros = await client.time()
    return int(seconds) * 1_000_000 + int(micros)


async def server_ms(client: redis.asyncio.Redis) -> int:
    """The server's clock (TIME), in ms."""
    return await server_us(client) // 1000


async def quorum_calls_ended(clients: list[redis.asyncio.Redis]) -> None:
    """Wait for the calls a quorum decided without (a slow node's, a late one's) to end:
    each ends within its node timeout. Until then such a call may still reach its node,
    or reach it again: after a restart, on the new, empty server."""
    backends = [
        runtime.backend
        for owner, runtime in list(_runtimes.items())
        if isinstance(owner, Quorum) and any(owner.uses(client) for client in clients)
    ]
    await eventually(
        lambda: not any(isinstance(b, QuorumBackend) and b._background for b in backends),
        what="the calls left to the slower nodes ended",
    )


async def connections_named(server: RedisServer, name: str) -> int:
    """How many connections the server has under the client name `name` (redis-py's
    `client_name`, which the connections aiolock opens for a client take too)."""
    admin = redis.asyncio.Redis.from_url(server.url)
    try:
        return sum(1 for client in await admin.client_list() if client.get("name") == name)
    finally:
        await admin.aclose()


def key_slot_of(key: str) -> int:
    """The cluster hash slot of `key`, as a client of the default encoding writes it."""
    return int(key_slot(key.encode()))
