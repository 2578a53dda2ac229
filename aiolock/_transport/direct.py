"""Direct sends: a script call packed by hiredis and written on a connection of the user's
client's pool, its reply read there, without redis-py's command layers: on one connection
the calls of every task share (`SharedConnection`) where the pool and the call allow it,
else on a connection of its own for the call."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import redis
import redis.asyncio
import redis.exceptions

from .base import (
    DRAIN_ABOVE,
    Command,
    Sent,
    Transport,
    checkin,
    checkout,
    exchange_packed,
    write,
)
from .clients import ClientLibrary
from .replies import direct_reader
from .shared_connection import SharedConnection
from .write_batch import WriteBatch

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency, but may be missing
    hiredis = None  # type: ignore[assignment]

__all__ = ("DirectTransport", "direct_connections", "exchange", "sends_directly")


def sends_directly(client: redis.asyncio.Redis, library: ClientLibrary) -> bool:
    """Whether aiolock may send its scripts on `client`'s connections itself.

    A script call through `execute_command` packs its arguments in Python and goes through
    redis-py's retry and instrumentation layers, which aiolock replaces with its own
    bounds; sending on a pooled connection directly, packed by hiredis, costs a fraction.
    Only the library's own connection classes with the default UTF-8 encoding qualify: any
    other connection (fakeredis, Sentinel-managed, a subclass), encoding, or a client
    bound to a single connection goes through `execute_command`.
    """
    pool = client.connection_pool
    return not client.single_connection_client and direct_connections(
        library, pool.connection_class, pool.connection_kwargs
    )


def direct_connections(
    library: ClientLibrary, connection_class: type[Any], kwargs: dict[str, Any]
) -> bool:
    """Whether aiolock may send on connections of `connection_class` made with `kwargs`
    itself (see `sends_directly`)."""
    return (
        hiredis is not None
        and connection_class in library.direct
        and str(kwargs.get("encoding", "utf-8")).lower().replace("_", "-") in ("utf-8", "utf8")
        and kwargs.get("encoding_errors", "strict") == "strict"
    )


async def exchange(
    connection: redis.asyncio.connection.AbstractConnection,
    command: Command,
    on_sent: Sent,
    then: Command | None,
    batch: WriteBatch,
) -> Any:
    """One command on `connection`, packed by hiredis, written (or held in `batch`, the
    running loop's), its reply read (with `then`, a `WAIT`: both written at once and both
    replies returned); see `exchange_packed`."""
    packed: bytes = hiredis.pack_command(command)  # type: ignore[arg-type]
    if then is not None:
        packed += hiredis.pack_command(then)  # type: ignore[arg-type]
    return await exchange_packed(
        connection, packed, on_sent, pair=then is not None, send=write, batch=batch
    )


class DirectTransport(Transport):
    """Script calls sent on the user's pooled connections by aiolock itself."""

    __slots__ = ("_apart", "_in_flight", "_making", "_shared", "shares")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shares = True
        """Whether calls may share a connection (`SharedConnection`): not a Redlock node's,
        whose give-back must not queue behind a call the network holds up on that node
        (each of its calls fails apart, within the node's own bound)."""
        self._shared: dict[int, SharedConnection] = {}
        """The shared connection in use of each pool (by its id), while calls wait on it."""
        self._making: dict[int, asyncio.Future[None]] = {}
        """A shared connection being taken from each pool (its connection made, say)."""
        self._apart: weakref.WeakSet[Any] = weakref.WeakSet()
        """The pools whose connections cannot be shared."""
        self._in_flight = 0
        """The calls sent and not yet answered (or being sent)."""

    async def send(
        self,
        client: redis.asyncio.Redis,  # type: ignore[override]
        command: Command,
        on_sent: Sent,
        then: Command | None = None,
    ) -> Any:
        """One command on a connection of `client`'s pool: for a call that waits only for
        its one reply (no `then`, no `on_sent`) while other calls of this transport are
        under way, the pool's shared one; else one of its own (see `exchange`).

        A connection closed while redis-py's checkout was handing it over (its user closed
        the client) is not connected again, as redis-py's write would: that is a
        `ConnectionError`, and the call is sent again as its caller decides (a call that
        may outlive its caller, on a connection of its own, not in the pool the user
        closed). (The quick checkout hands over a connected one without a pause.)"""
        pool = client.connection_pool
        others = self._in_flight
        self._in_flight = others + 1
        try:
            if then is None and on_sent is None and self.shares:
                shared = self._shared.get(id(pool))
                if shared is None and others:
                    shared = await self._share(pool)
                if shared is not None:
                    packed: bytes = hiredis.pack_command(command)  # type: ignore[arg-type]
                    if len(packed) < DRAIN_ABOVE:
                        return await self._call_shared(shared, packed)
            connection, quick = await checkout(pool, str(command[0]))
            try:
                if not quick and not connection.is_connected:
                    raise redis.exceptions.ConnectionError(
                        "the connection was closed under the call"
                    )
                return await exchange(connection, command, on_sent, then, self.batch)
            finally:
                await checkin(pool, connection, quick)
        finally:
            self._in_flight -= 1

    async def _call_shared(self, shared: SharedConnection, packed: bytes) -> Any:
        batch = self.batch
        batch.awaiting += 1  # (what a loop that hides its ready callbacks batches by)
        try:
            return await shared.call(packed, batch)
        finally:
            batch.awaiting -= 1

    async def _share(self, pool: Any) -> SharedConnection | None:
        """A new shared connection taken from `pool`, or None if its connections cannot be
        shared (connections not read straight from hiredis, `replies`),
        or, for a call that came while another took one, if that one could not. Calls that
        come while one is taken wait for it (a pool with no idle connection makes one)."""
        key = id(pool)
        making = self._making.get(key)
        if making is not None:
            await asyncio.wait((making,))
            return self._shared.get(key)
        if pool in self._apart:
            return None
        making = self._making[key] = asyncio.get_running_loop().create_future()
        try:
            connection, quick = await checkout(pool, "EVALSHA")
            if not connection.is_connected or direct_reader(connection) is None:
                await checkin(pool, connection, quick)
                if connection.is_connected:
                    self._apart.add(pool)
                return None
            shared = SharedConnection(pool, connection, quick, self._shared)
            return shared
        finally:
            del self._making[key]
            making.set_result(None)
