"""How aiolock's commands reach the server, whatever client the user hands it.

On redis-py's own connection classes aiolock sends its scripts on a pooled connection
directly; every other client (a single-connection client, another encoding, fakeredis, a
connection subclass) goes through `execute_command`. Both must behave the same, and a call
that is cancelled or times out mid-reply must never hand a connection with an unread reply
back to the user's pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.connection import Connection

from aiolock import BackendError, Lock, LockOptions
from aiolock._engine.runtime import runtime_for
from aiolock._transport import base as _transport
from aiolock._transport import clients as _clients
from aiolock._transport.base import CommandTransport
from aiolock._transport.direct import DirectTransport

from ..conftest import make_client
from ..support.servers import RedisServer
from ..support.waits import eventually, within
from .test_stalls import queued

pytestmark = pytest.mark.real_only


class _Subclass(Connection):
    """A user's connection subclass: aiolock cannot know what it changes, so it uses
    `execute_command`."""


CLIENTS: dict[str, dict[str, Any]] = {
    "default": {},
    "decode_responses": {"decode_responses": True},
    "resp3": {"protocol": 3},
    "single_connection": {"single_connection_client": True},
    "latin-1": {"encoding": "latin-1"},
    "subclass": {"connection_class": _Subclass},
}
DIRECT = {"default", "decode_responses", "resp3"}


@pytest.fixture(params=sorted(CLIENTS))
async def kind_and_client(
    request: pytest.FixtureRequest, server_url: str
) -> AsyncIterator[tuple[str, redis.asyncio.Redis]]:
    kind = str(request.param)
    client = make_client(server_url, **CLIENTS[kind])
    try:
        yield kind, client
    finally:
        await client.aclose()


async def test_every_kind_of_client_locks_waits_and_hands_over(
    kind_and_client: tuple[str, redis.asyncio.Redis], name: str, server_url: str
) -> None:
    kind, client = kind_and_client
    lock_name = f"{name}:é"  # not ASCII: both paths must encode it as the client does
    lock = Lock(client, lock_name, ttl=5)
    backend = runtime_for(client).backend
    assert type(backend.transport) is (DirectTransport if kind in DIRECT else CommandTransport)

    first = await lock.acquire()
    # The waiter is another process's (a client of its own): the release's message, on
    # the client's encoding, wakes it.
    other = make_client(server_url, **CLIENTS[kind])
    try:
        waiter = asyncio.create_task(Lock(other, lock_name, ttl=5).acquire(timeout=5))
        info = await lock.info()
        assert info is not None and info.fencing_token == first.fencing_token
        notifier = runtime_for(other).notifier
        await queued(client, lock_name, waiter=other)
        await first.release()
        second = await within(waiter, what="the waiter to get the lock")
        # Woken by the release's message (the listener still running), not by a check.
        assert notifier.messages_received == 1 and notifier.running
        assert second.fencing_token > first.fencing_token
        await second.extend()
        await second.release()
    finally:
        await other.aclose()
    assert not await lock.locked()
    # The key is where the client's own commands find it.
    encoding = CLIENTS[kind].get("encoding", "utf-8")
    assert await client.exists(lock.key.encode(encoding)) == 1  # the state, kept


class Reading(Connection):
    """Counts the replies its connections have started to wait for."""

    reads = 0

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        type(self).reads += 1
        return await super().read_response(*args, **kwargs)


@pytest.fixture
def reading() -> Iterator[type[Reading]]:
    """A connection class of this test's own, on which aiolock sends directly."""

    class ReadingHere(Reading):
        pass

    _clients.DIRECT_CONNECTIONS.add(ReadingHere)
    try:
        yield ReadingHere
    finally:
        _clients.DIRECT_CONNECTIONS.discard(ReadingHere)


async def test_a_call_cut_off_mid_reply_leaves_the_pool_clean(
    server: RedisServer, name: str, reading: type[Reading]
) -> None:
    """A script call cancelled while Redis is frozen: its connection is closed, not put
    back in the pool with the reply still to come, where the user's next command on that
    connection would read the script's reply as its own."""
    client = make_client(server.url, connection_class=reading)
    assert type(runtime_for(client).backend.transport) is DirectTransport
    try:
        lease = await Lock(client, name, ttl=30).acquire()  # one pooled connection, reused
        server.pause()
        try:
            reads = reading.reads
            extending = asyncio.create_task(lease.extend())
            await eventually(  # sent; no reply while the server is frozen
                lambda: reading.reads > reads, what="the extend waiting for its reply"
            )
            extending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await within(extending, what="the cancelled extend to end")

            # Sent while the reply to the script is still due.
            async def set_mine() -> object:
                return await client.set(f"{name}:k", "mine")

            reads = reading.reads
            setting = asyncio.create_task(set_mine())
            await eventually(lambda: reading.reads > reads, what="the SET waiting for its reply")
        finally:
            server.resume()
        assert await within(setting, what="the SET sent while the reply was due") is True
        assert await client.get(f"{name}:k") == b"mine"
        assert await client.ping() is True
        await lease.release()
    finally:
        await client.aclose()


async def test_a_frozen_server_bounds_the_call_and_the_pool_stays_usable(
    server: RedisServer, name: str
) -> None:
    client = make_client(server.url)
    try:
        lock = Lock(client, name, ttl=0.5)
        server.pause()
        try:
            with pytest.raises(BackendError, match="no reply from Redis"):
                await lock.acquire(timeout=0.2)
        finally:
            server.resume()
        assert await client.ping() is True
        async with lock as lease:
            assert lease.fencing_token > 0
    finally:
        await client.aclose()


@pytest.mark.parametrize(("reply_timeout", "says"), [(None, "1s"), (0.05, "0.05s")])
async def test_a_try_gives_redis_the_reply_window_it_is_set(
    server: RedisServer, name: str, reply_timeout: float | None, says: str
) -> None:
    """A try (timeout 0, as the web helpers' default) still gives Redis a window to answer:
    1 s by default (a loaded host can miss it), `reply_timeout` when set; past it, the
    error names the window."""
    client = make_client(server.url)
    options: LockOptions = {"ttl": 30}
    if reply_timeout is not None:
        options["reply_timeout"] = reply_timeout
    try:
        lock = Lock(client, name, **options)
        server.pause()
        try:
            with pytest.raises(BackendError, match=rf"no reply from Redis within {says}"):
                await lock.try_acquire()
        finally:
            server.resume()
        async with lock as lease:
            assert lease.fencing_token > 0
    finally:
        await client.aclose()


# A write on a connection that another task closed meanwhile: redis-py's connection has let
# go of its stream writer and fails with AttributeError ("'NoneType' object has no attribute
# 'writelines'") from its own module, as seen under cluster failovers.
_CLOSED_UNDERNEATH = compile(
    "def write_on_closed(command):\n    writer = None\n    writer.writelines(command)\n",
    "redis/asyncio/connection.py",
    "exec",
)
_REDIS_CONNECTION_MODULE: dict[str, Any] = {"__name__": "redis.asyncio.connection"}
exec(_CLOSED_UNDERNEATH, _REDIS_CONNECTION_MODULE)  # noqa: S102 - a frame of that module


class ClosedUnderneath(Connection):
    """Its next write, once `armed`, fails as on a connection closed underneath it."""

    armed = False

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if ClosedUnderneath.armed:
            ClosedUnderneath.armed = False
            await self.disconnect()
            _REDIS_CONNECTION_MODULE["write_on_closed"](command)
        await super().send_packed_command(command, check_health)


async def test_a_write_on_a_connection_closed_underneath_is_a_broken_connection(
    server_url: str, name: str
) -> None:
    """redis-py's AttributeError for a write on a connection closed by another task is a
    broken connection like any other: the call is sent again on a new one, and the caller
    gets its lease, not an AttributeError."""
    client = redis.asyncio.Redis.from_url(server_url, connection_class=ClosedUnderneath)
    try:
        assert await client.ping()
        ClosedUnderneath.armed = True
        lease = await Lock(client, name, ttl=5).acquire(timeout=0)
        assert not ClosedUnderneath.armed, "the write did not fail as planned"
        await lease.release()
    finally:
        ClosedUnderneath.armed = False
        await client.aclose()


@pytest.fixture
def checkouts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the connections taken through redis-py's own checkout."""
    counted = [0]
    original = _transport.pooled

    def counting(pool: Any, command: str) -> Awaitable[Any]:
        counted[0] += 1
        return original(pool, command)

    monkeypatch.setattr(_transport, "pooled", counting)
    return counted


async def test_a_plain_pools_idle_connection_is_lent_past_redis_pys_checkout(
    server_url: str, name: str, checkouts: list[int]
) -> None:
    """After the first call opened a connection, each call borrows the idle one directly
    and gives it back: the pool's own bookkeeping (in use, idle) stays as redis-py keeps
    it, and a connection closed while idle is opened again redis-py's way. A redis-py
    whose connections cannot tell what is buffered without reading (before 8) is used its
    own way throughout."""
    lends = hasattr(Connection, "can_read")
    client = make_client(server_url)
    try:
        lock = Lock(client, name, ttl=5)
        async with lock:
            pass
        pool = client.connection_pool
        opened = checkouts[0]
        assert opened >= 1
        for _ in range(20):
            async with lock as lease:
                pass
            assert lease.released
        assert not pool._in_use_connections
        if not lends:
            assert checkouts[0] == opened + 40  # an acquire and a release each
            return
        assert checkouts[0] == opened, "no connection taken redis-py's way once one was idle"
        idle = list(pool._available_connections)
        assert idle and all(connection.is_connected for connection in idle)
        for connection in idle:
            await connection.disconnect()
        async with lock:
            pass
        assert checkouts[0] == opened + 1, "a closed idle connection goes redis-py's way"
        assert await client.ping() is True
    finally:
        await client.aclose()


class _NoCredentials(redis.CredentialProvider):
    """A credential provider for a server without a password: no AUTH is sent."""

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        return ()  # type: ignore[return-value]


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"protocol": 3}, id="RESP3 (push notifications between replies)"),
        pytest.param(
            {"credential_provider": _NoCredentials()},
            id="a credential provider (re-authenticated when given back)",
        ),
    ],
)
async def test_a_pool_whose_connections_need_redis_pys_care_is_used_its_way(
    server_url: str, name: str, checkouts: list[int], settings: dict[str, Any]
) -> None:
    client = make_client(server_url, **settings)
    try:
        lock = Lock(client, name, ttl=5)
        async with lock:
            pass
        before = checkouts[0]
        for _ in range(5):
            async with lock:
                pass
        assert checkouts[0] - before >= 10  # acquire and release each take one
    finally:
        await client.aclose()
