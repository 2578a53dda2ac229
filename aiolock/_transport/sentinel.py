"""Sentinel re-targeting: every call of a client of `Sentinel.master_for` goes to the master
the Sentinels name now.

aiolock's own connections are Sentinel-managed pools of the same service, which find the
master when they connect. Before each call, on the user's pool or aiolock's own, the
Sentinels are asked where the master is (one more round trip, to a Sentinel), and a pooled
connection to a former master (one the Sentinels no longer name, which may still take
writes until they demote it) is closed and opened again to the new one. The notifier's
listener asks the same of its pub/sub connection (`master_moved`).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Final

import redis
import redis.asyncio
import redis.exceptions
from redis.asyncio.client import PubSub
from redis.asyncio.sentinel import SentinelConnectionPool

from .base import Command, CommandTransport, Sent, Transport, exchange_packed, pooled
from .clients import ClientLibrary, Errors

__all__ = ("SentinelReplicaTransport", "SentinelTransport")

logger = logging.getLogger("aiolock")

_DISCOVERY_BOUND: Final = 0.25
"""Longest wait for the Sentinels to name the master before a call; past it, the call goes
on the pooled connection as it is."""


async def _master_address(pool: SentinelConnectionPool) -> tuple[str, int] | None:
    """Where the Sentinels say the master of `pool`'s service is now (redis-py then drops
    the pool's idle connections to a former master); None if no Sentinel answered within
    `_DISCOVERY_BOUND`."""
    try:
        async with asyncio.timeout(_DISCOVERY_BOUND):
            address: tuple[str, int] = await pool.get_master_address()  # type: ignore[no-untyped-call]
    except Errors.with_timeout as exc:
        logger.debug("aiolock: no Sentinel named the master, using the connection: %s", exc)
        return None
    return address


class SentinelTransport(Transport):
    """A client of a Sentinel-managed master: see the module docstring."""

    sentinel = True
    __slots__ = ("_pool",)

    def __init__(self, *args: Any, pool: SentinelConnectionPool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pool = pool

    @classmethod
    def for_client(
        cls, library: ClientLibrary, client: redis.asyncio.Redis, loop: asyncio.AbstractEventLoop
    ) -> Transport:
        """The transport of a client whose pool is Sentinel-managed: aiolock's own pools are
        Sentinel-managed pools of the same service (their connections find the master
        through the pool that made them)."""
        pool = client.connection_pool
        assert isinstance(pool, library.sentinel_pool)
        kwargs = dict(pool.connection_kwargs)
        kwargs["retry"] = library.no_retry()
        kwargs.pop("connection_pool", None)
        return cls(
            library,
            weakref.ref(client),
            connection_class=pool.connection_class,
            connection_kwargs=kwargs,
            loop=loop,
            pool=pool,
        )

    def connection_pool(self, key: str | None = None) -> redis.asyncio.ConnectionPool:
        """A Sentinel-managed pool of the same service and Sentinels, which finds the master
        for itself."""
        sentinel = self._pool
        return self.library.sentinel_pool(
            sentinel.service_name,
            sentinel.sentinel_manager,
            is_master=sentinel.is_master,
            check_connection=sentinel.check_connection,
            connection_class=self.connection_class,
            **self.connection_kwargs,
        )

    async def master_moved(self, pubsub: PubSub) -> bool:
        """Whether `pubsub`'s connection is open to a server that the Sentinels no longer
        name as the master (False for a client without Sentinel, or if no Sentinel answered
        in time)."""
        # redis-py types `PubSub.connection` as always None.
        connection: redis.asyncio.Connection | None = getattr(pubsub, "connection", None)
        pool = pubsub.connection_pool
        if (
            connection is None
            or not isinstance(pool, self.library.sentinel_pool)
            or not pool.is_master
        ):
            return False
        address = await _master_address(pool)
        return address is not None and (connection.host, connection.port) != tuple(address)

    async def send(
        self,
        client: redis.asyncio.Redis,  # type: ignore[override]
        command: Command,
        on_sent: Sent,
        then: Command | None = None,
    ) -> Any:
        """One command on a connection of a Sentinel-managed pool (the user's, or aiolock's
        own), which must reach the master the Sentinels name now.

        A pooled connection stays open to the server it was opened to; after a failover that
        is a former master, which keeps its role (and takes writes) until the Sentinels demote
        it, about ten seconds later. Such a connection is closed and opened again, to the new
        master. When no Sentinel answers, the connection is used as it is (as redis-py would).
        A former master that was demoted already refuses writes with READONLY: redis-py's
        connection then closes itself and raises `ConnectionError`, and `Backend._call`
        sends again.
        """
        pool: Any = client.connection_pool  # a Sentinel-managed pool, of either library
        address = await _master_address(pool)
        connection = await pooled(pool, str(command[0]))
        try:
            if address is not None and (connection.host, connection.port) != tuple(address):
                # Opened again here, through the pool, which asks the Sentinels: a send on a
                # closed connection would reopen it to the address it had (redis-py 8 does).
                await connection.disconnect()
                await connection.connect()
            packed = connection.pack_command(*command)
            if then is not None:
                packed += connection.pack_command(*then)
            try:
                return await exchange_packed(
                    connection,
                    packed,
                    on_sent,
                    pair=then is not None,
                    send=_send_packed,
                    batch=self.batch,
                )
            except Errors.response as exc:
                if not (_refused_as_replica(exc) and getattr(pool, "is_master", False)):
                    raise
                # What redis-py's connection does with READONLY, for the one a script met:
                # Redis 6.2 wraps it in the script's error, which redis-py does not see.
                await connection.disconnect()
                raise redis.exceptions.ConnectionError(
                    "the master the Sentinels named is now a replica (READONLY)"
                ) from exc
        finally:
            await pool.release(connection)


def _refused_as_replica(error: BaseException) -> bool:
    """Whether a script's error is a write refused by a replica (READONLY), as Redis 6.2
    reports it: inside the script's error ("Error running script ...: -READONLY ...")."""
    return "-READONLY " in str(error)


class SentinelReplicaTransport(SentinelTransport):
    """A client of a Sentinel-managed replica: its pools are Sentinel-managed, and its
    calls go through `execute_command`."""

    sees_writes = False
    __slots__ = ()
    send = CommandTransport.send


async def _send_packed(connection: Any, packed: bytes, on_sent: Sent, batch: object) -> None:
    """redis-py's write (on a Sentinel-managed connection, whose pool may reconnect it),
    never held in `batch`."""
    await connection.send_packed_command(packed)
    if on_sent is not None:
        on_sent()
