"""Replies read straight from a connection's hiredis reader (`_transport.replies`).

aiolock reads the replies to its own calls without redis-py's `read_response` layers where
that reads as redis-py would, and by `read_response` elsewhere. These tests hold it to
redis-py's behaviour: the reply itself (whole, or in many reads), an error reply raised
with the connection kept, and a broken or cancelled read closing the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import hiredis
import pytest
import redis.asyncio
import redis.asyncio.sentinel
import redis.exceptions
from redis._parsers import _AsyncRESP2Parser

from aiolock import Lock
from aiolock._transport.base import exchange_packed, pooled, write
from aiolock._transport.replies import _reads_as_redis_py, direct_reader
from aiolock._transport.write_batch import batch_for

from ..conftest import make_client
from ..deployments.proxy import FaultProxy
from ..support.waits import eventually, within

pytestmark = pytest.mark.real_only


@contextlib.asynccontextmanager
async def connection_of(
    client: redis.asyncio.Redis,
) -> AsyncIterator[redis.asyncio.connection.Connection]:
    """A connected connection of `client`'s pool, given back (and the client closed) after."""
    pool = client.connection_pool
    connection = await pooled(pool, "ECHO")  # (redis-py 5 names the command)
    try:
        yield connection
    finally:
        await pool.release(connection)
        await client.aclose()


async def exchange(connection: Any, *command: str | bytes | int) -> Any:
    packed: bytes = hiredis.pack_command(command)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    return await exchange_packed(
        connection, packed, None, pair=False, send=write, batch=batch_for(loop)
    )


async def test_a_lock_cycle_reads_its_replies_without_read_response(
    server_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acquire and a release on a client as users make them: both replies read from
    the hiredis reader, none by `Connection.read_response`.

    Break seen failing: `base.reader` no longer asking `direct_reader`."""
    client = make_client(server_url)
    try:
        await (await Lock(client, name, ttl=5).acquire()).release()  # (scripts loaded)
        calls = 0
        read_response = redis.asyncio.connection.Connection.read_response

        async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            return await read_response(self, *args, **kwargs)

        monkeypatch.setattr(redis.asyncio.connection.Connection, "read_response", counted)
        async with Lock(client, name, ttl=5) as lease:
            assert lease.held
        assert calls == 0
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("kwargs", "direct"),
    [
        ({}, True),
        ({"protocol": 2}, True),
        ({"health_check_interval": 30}, False),
        ({"parser_class": _AsyncRESP2Parser}, False),
    ],
    ids=["default", "resp2", "health-checked", "python-parser"],
)
async def test_read_directly_only_where_it_reads_as_redis_py(
    server_url: str, kwargs: dict[str, Any], direct: bool
) -> None:
    """redis-py's hiredis parser without health checks is read directly (RESP3, its
    default, or RESP2); a connection whose reads postpone its health check, or with
    another parser, by its `read_response`. Either way a reply reads the same."""
    async with connection_of(make_client(server_url, **kwargs)) as connection:
        assert (direct_reader(connection) is not None) is direct
        assert await exchange(connection, "ECHO", "hello") == b"hello"


class Instrumented(redis.asyncio.connection.Connection):
    """A user's connection class that counts the replies it reads."""

    replies = 0

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        Instrumented.replies += 1
        return await super().read_response(*args, **kwargs)


async def test_a_connection_class_that_reads_its_own_way_is_read_by_it(
    server_url: str, name: str
) -> None:
    """A connection class whose `read_response` is its own (a user's instrumentation, a
    Sentinel-managed connection's, which turns READONLY into a connection error) is read
    through it: a lock cycle's two replies are counted.

    Break seen failing: `direct_reader` asking only for redis-py's parser (a renewal
    refused by a demoted Sentinel master failed, where it goes again to the new master)."""
    client = make_client(server_url, connection_class=Instrumented)
    try:
        async with connection_of(make_client(server_url, connection_class=Instrumented)) as c:
            assert direct_reader(c) is None
        await (await Lock(client, name, ttl=5).acquire()).release()  # (scripts loaded)
        before = Instrumented.replies
        async with Lock(client, name, ttl=5):
            pass
        assert Instrumented.replies - before == 2
    finally:
        await client.aclose()
    managed = redis.asyncio.sentinel.SentinelManagedConnection
    assert not _reads_as_redis_py(managed)


async def test_a_reply_longer_than_one_read_is_read_whole(server_url: str, name: str) -> None:
    """A reply of 1 MB arrives in many reads of the stream: it is fed to the reader until
    it is whole, and the next reply on the connection is its own."""
    value = b"x" * (1 << 20)
    async with connection_of(make_client(server_url)) as connection:
        assert direct_reader(connection) is not None
        assert await exchange(connection, "SET", name, value) == b"OK"
        assert await exchange(connection, "GET", name) == value
        assert await exchange(connection, "DEL", name) == 1


async def test_an_error_reply_is_raised_and_the_connection_kept(server_url: str, name: str) -> None:
    """A command the server refuses raises redis-py's `ResponseError`; the connection stays
    open, its next reply its own."""
    async with connection_of(make_client(server_url)) as connection:
        assert await exchange(connection, "SET", name, "a string") == b"OK"
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            await exchange(connection, "HGET", name, "field")
        assert connection.is_connected
        assert await exchange(connection, "DEL", name) == 1


async def test_a_connection_closed_by_the_server_during_a_read_raises_and_is_closed(
    server_url: str, name: str
) -> None:
    """The server closes the connection while its reply is awaited (CLIENT KILL of a
    blocked BLPOP): redis-py's `ConnectionError`, and the connection closed, never given
    back with a half-read reply."""
    other = make_client(server_url)
    async with connection_of(make_client(server_url)) as connection:
        await exchange(connection, "CLIENT", "SETNAME", "replies-killed")
        blocked = asyncio.create_task(exchange(connection, "BLPOP", name, 30))

        async def named_blocked() -> bool:
            clients = await other.client_list()
            return any(c["name"] == "replies-killed" and c["cmd"] == "blpop" for c in clients)

        try:
            await eventually(named_blocked, what="the BLPOP blocked on the server")
            for entry in await other.client_list():
                if entry.get("name") == "replies-killed":
                    await other.client_kill(entry["addr"])
            with pytest.raises(redis.exceptions.ConnectionError):
                await within(blocked, what="the read of the killed connection")
        finally:
            blocked.cancel()
            with contextlib.suppress(BaseException):
                await blocked
            await other.aclose()
        assert not connection.is_connected


async def test_a_cancelled_read_closes_the_connection(server_url: str, name: str) -> None:
    """A read cancelled while its reply is awaited closes the connection, as redis-py's
    does: a reply that comes later is never read as the next command's."""
    async with connection_of(make_client(server_url)) as connection:
        blocked = asyncio.create_task(exchange(connection, "BLPOP", name, 30))
        await eventually(lambda: blocked_started(blocked), what="the BLPOP written")
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(blocked, what="the cancelled read")
        assert not connection.is_connected


def blocked_started(task: asyncio.Task[Any]) -> bool:
    """Whether `task` has run up to an await (its command written)."""
    return not task.done() and task._fut_waiter is not None  # type: ignore[attr-defined]


async def test_a_reset_connection_raises_redis_pys_connection_error(
    server_url: str, name: str
) -> None:
    """The connection is reset (RST) while its reply is awaited: the socket's error comes
    as redis-py's `ConnectionError` (what aiolock sends again on a new connection), not as
    the bare `OSError`, and the connection is closed."""
    port = urllib.parse.urlsplit(server_url).port
    assert port is not None
    proxy = await FaultProxy(port).start()
    try:
        async with connection_of(make_client(proxy.url)) as connection:
            blocked = asyncio.create_task(exchange(connection, "BLPOP", name, 30))
            try:
                await eventually(lambda: bool(proxy.arrived(b"BLPOP")), what="the BLPOP sent")
                assert proxy.reset_all() == 1
                with pytest.raises(redis.exceptions.ConnectionError) as caught:
                    await within(blocked, what="the read of the reset connection")
                assert isinstance(caught.value.__cause__, OSError), repr(caught.value)
            finally:
                blocked.cancel()
                with contextlib.suppress(BaseException):
                    await blocked
            assert not connection.is_connected
    finally:
        await proxy.aclose()
