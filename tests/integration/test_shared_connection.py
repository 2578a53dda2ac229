"""Calls of many tasks on one connection (`_transport.shared_connection`).

The calls are written together and their replies handed out in the order they were
written, read by one of the callers at a time. These tests hold it to what a connection of
one's own promises: each caller gets its own reply, whoever gives up; an error reply is
its caller's alone; a broken connection fails the calls on it and the next call takes a
fresh one; and nothing stays checked out of the pool, nor unread on a connection given
back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import hiredis
import pytest
import redis.asyncio
import redis.exceptions

from aiolock import Lock
from aiolock._transport.base import checkin, checkout
from aiolock._transport.shared_connection import SharedConnection
from aiolock._transport.write_batch import batch_for

from ..conftest import make_client
from ..deployments.proxy import FaultProxy
from ..support.servers import RedisServer
from ..support.waits import eventually, within

pytestmark = pytest.mark.real_only


@contextlib.asynccontextmanager
async def shared_of(client: redis.asyncio.Redis) -> AsyncIterator[SharedConnection]:
    """A shared connection taken from `client`'s pool (the client closed after)."""
    try:
        shared, _ = await shared_from(client.connection_pool)
        yield shared
    finally:
        await client.aclose()


async def shared_from(pool: Any) -> tuple[SharedConnection, Any]:
    """A shared connection taken from `pool` (given back to it), and its connection."""
    connection, quick = await checkout(pool, "ECHO")

    async def give_back(connection: Any) -> None:
        await checkin(pool, connection, quick)

    return SharedConnection(connection, give_back), connection


def call(shared: SharedConnection, *command: str | int) -> Any:
    packed: bytes = hiredis.pack_command(command)  # type: ignore[arg-type]
    return shared.call(packed, batch_for(asyncio.get_running_loop()))


def in_use(client: redis.asyncio.Redis) -> int:
    return len(client.connection_pool._in_use_connections)


async def test_the_calls_of_many_tasks_go_on_one_connection(server_url: str, name: str) -> None:
    """64 tasks, each taking and giving back a lock of its own name, 5 times: their calls
    share a connection (the pool made no connection per task), and none is left checked
    out.

    Break seen failing: no connection shared (each call on a connection of its own)."""
    client = make_client(server_url)
    try:

        async def cycles(i: int) -> list[int]:
            tokens = []
            for _ in range(5):
                async with Lock(client, f"{name}:{i}", ttl=10) as lease:
                    tokens.append(lease.fencing_token)
            return tokens

        tokens = await within(asyncio.gather(*map(cycles, range(64))), what="every cycle")
        assert all(t == sorted(set(t)) and len(t) == 5 for t in tokens)
        pool = client.connection_pool
        assert len(pool._available_connections) <= 4, pool._available_connections
        assert in_use(client) == 0
    finally:
        await client.aclose()


async def test_each_caller_gets_its_own_reply_when_others_give_up(
    server_url: str, name: str
) -> None:
    """40 calls written together behind a pop that blocks; every third caller gives up
    while they wait: once the pop is served, each of the others gets its own reply (the
    replies of those who gave up read and dropped, in their place), and the connection,
    drained, goes back to the pool open.

    Break seen failing: a caller that gives up taken out of the line (the replies after it
    go to the wrong callers)."""
    client, pusher = make_client(server_url), make_client(server_url)
    async with shared_of(client) as shared:
        first = asyncio.ensure_future(call(shared, "ECHO", "first"))
        blocked = asyncio.ensure_future(call(shared, "BLPOP", name, 10))
        tasks = [asyncio.ensure_future(call(shared, "ECHO", f"reply {i}")) for i in range(40)]
        assert await within(first, what="the first reply") == b"first"
        await eventually(lambda: _blocked_clients(pusher), what="the pop blocked")
        for task in tasks[::3]:
            task.cancel()
        await pusher.lpush(name, "x")
        replies = await within(asyncio.gather(*tasks, return_exceptions=True), what="every reply")
        for i, reply in enumerate(replies):
            if i % 3:
                assert reply == f"reply {i}".encode(), (i, reply)
            else:
                assert isinstance(reply, asyncio.CancelledError), (i, reply)
        assert await blocked == [name.encode(), b"x"]
        assert_given_back_open(client, shared)
    await pusher.aclose()


def assert_given_back_open(client: redis.asyncio.Redis, shared: SharedConnection) -> None:
    """`shared` drained: its connection back in `client`'s pool, open."""
    pool = client.connection_pool
    assert shared.retired and shared._connection.is_connected
    assert shared._connection in pool._available_connections and not pool._in_use_connections


async def test_a_cancelled_reader_hands_the_reading_on(server_url: str, name: str) -> None:
    """A reader that gives up (the first caller, reading on once its own reply came, is
    cancelled) names the next caller to read; and a caller named to read but cancelled
    before it could names the one after it. The reply of the call given up is still read
    (the blocked pop it made is done) and dropped.

    Break seen failing: a reader that gives up without handing the reading on, whether it
    was reading or only named to (the last caller is never answered)."""
    client, pusher = make_client(server_url), make_client(server_url)
    async with shared_of(client) as shared:
        first = asyncio.ensure_future(call(shared, "PING"))
        blocked = asyncio.ensure_future(call(shared, "BLPOP", name, 10))
        named = asyncio.ensure_future(call(shared, "ECHO", "named"))
        last = asyncio.ensure_future(call(shared, "ECHO", "last"))
        assert await within(first, what="the first reply") in (b"PONG", "PONG", True)
        await eventually(lambda: _blocked_clients(pusher), what="the pop blocked on the server")
        # The blocked call reads now (named by the first caller when it got its reply).
        blocked.cancel()
        await asyncio.sleep(0)  # it hands the reading on to `named` ...
        named.cancel()  # ... which is cancelled before it runs
        await pusher.lpush(name, "x")
        assert await within(last, what="the last reply") == b"last"
        assert blocked.cancelled() and named.cancelled()
        assert await pusher.llen(name) == 0, "the call given up was applied"
        assert_given_back_open(client, shared)
    await pusher.aclose()


async def _blocked_clients(client: redis.asyncio.Redis) -> bool:
    info = await client.info("clients")
    return int(info["blocked_clients"]) >= 1


async def test_an_error_reply_is_its_callers_alone(server_url: str) -> None:
    client = make_client(server_url)
    async with shared_of(client) as shared:
        refused = asyncio.ensure_future(call(shared, "EVALSHA", "0" * 40, 0))
        echoed = asyncio.ensure_future(call(shared, "ECHO", "fine"))
        with pytest.raises(redis.exceptions.NoScriptError):
            await within(refused, what="the refused call")
        assert await within(echoed, what="the other call") == b"fine"
        assert_given_back_open(client, shared)


async def test_a_broken_connection_fails_the_calls_on_it_and_the_next_takes_another(
    server_url: str, name: str
) -> None:
    """The connection is killed while calls wait on it: each fails with a
    `ConnectionError` (none hangs), it is given back closed, and the next call through the
    client's transport takes a connection again."""
    client, killer = make_client(server_url), make_client(server_url)
    try:
        pool = client.connection_pool
        shared, connection = await shared_from(pool)
        calls = [
            asyncio.ensure_future(call(shared, "BLPOP", name, 10)),
            asyncio.ensure_future(call(shared, "ECHO", "behind")),
        ]
        await eventually(lambda: _blocked_clients(killer), what="the pop blocked")
        await killer.client_kill_filter(_type="normal", skipme=True)
        for outcome in await within(
            asyncio.gather(*calls, return_exceptions=True), what="both calls failed"
        ):
            assert isinstance(outcome, redis.exceptions.ConnectionError), outcome
        assert shared.retired and not connection.is_connected
        assert in_use(client) == 0
        async with Lock(client, name, ttl=5) as lease:
            assert lease.held
    finally:
        await client.aclose()
        await killer.aclose()


async def test_closing_the_client_ends_a_call_waiting_on_its_shared_connection(
    server_url: str, name: str
) -> None:
    client = make_client(server_url)
    pool = client.connection_pool
    shared, _ = await shared_from(pool)
    waiting = asyncio.ensure_future(call(shared, "BLPOP", name, 10))
    await asyncio.sleep(0.01)
    await client.aclose()
    with pytest.raises(redis.exceptions.ConnectionError):
        await within(waiting, what="the call on the closed client")
    assert shared.retired


async def test_a_drained_connection_goes_back_to_the_pool(server_url: str) -> None:
    """Once no call waits on it, the connection is back in the pool (the next user of the
    pool may take it), and the shared connection takes no more calls."""
    client = make_client(server_url)
    async with shared_of(client) as shared:
        assert await within(call(shared, "ECHO", "one"), what="the reply") == b"one"
        assert_given_back_open(client, shared)
        with pytest.raises(redis.exceptions.ConnectionError):
            await call(shared, "ECHO", "two")


async def test_a_call_given_up_with_nothing_answered_retires_the_connection(
    server: RedisServer,
) -> None:
    """The server stops answering (a blackhole) while two calls wait on a shared
    connection; one gives up: nothing was answered since it was queued, so the connection
    may be dead, and it is retired at once: the other call fails with a
    `ConnectionError` (to be sent again on another connection) rather than waiting out its
    own bound on it.

    Break seen failing: no retirement (the other call waits on the dead connection)."""
    proxy = await FaultProxy(server.port).start()
    client = make_client(proxy.url)
    try:
        pool = client.connection_pool
        shared, connection = await shared_from(pool)
        proxy.blackhole()
        given_up = asyncio.ensure_future(call(shared, "ECHO", "given up"))
        other = asyncio.ensure_future(call(shared, "ECHO", "other"))
        await asyncio.sleep(0.05)
        given_up.cancel()
        with pytest.raises(redis.exceptions.ConnectionError):
            await within(other, what="the other call", timeout=2)
        assert shared.retired and not connection.is_connected
        assert not pool._in_use_connections
    finally:
        await proxy.restore()
        await client.aclose()
        await proxy.aclose()


async def test_a_write_the_loop_refuses_on_a_reset_connection_is_a_broken_connection(
    server_url: str,
) -> None:
    """uvloop refuses a write on a transport the other end reset ("the handler is
    closed"): on a shared connection that is a `ConnectionError` (sent again on another
    connection by its caller), and the connection is given back closed.

    Break seen failing: the write's `RuntimeError` raised as it is."""
    client = make_client(server_url)
    try:
        pool = client.connection_pool
        shared, connection = await shared_from(pool)

        def refused(data: bytes) -> None:
            raise RuntimeError(
                "unable to perform operation on <TCPTransport>; the handler is closed"
            )

        connection._writer.write = refused
        with pytest.raises(redis.exceptions.ConnectionError):
            await within(call(shared, "ECHO", "x"), what="the refused write")
        assert shared.retired and not connection.is_connected
        assert not pool._in_use_connections
    finally:
        await client.aclose()
