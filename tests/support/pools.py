"""Connections that misbehave on cue: a pool that its user closes under a call, at a chosen
moment (`ClosedByItsUser`); a connection slow to connect (`SlowToConnect`)."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio


class ClosedByItsUser(redis.asyncio.ConnectionPool):
    """A pool whose user closes it (every connection) once, at the moment `close_at` says:
    right after a call took a connection ("checkout"), or just as a call gave its
    connection back with the answer ("checkin"). Not redis-py's own class, so aiolock
    takes and gives back connections through these methods."""

    close_at: str | None = None
    closes = 0

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        connection = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        await self._closed_at("checkout")
        return connection

    async def release(self, connection: Any) -> None:
        await super().release(connection)
        await self._closed_at("checkin")

    async def _closed_at(self, moment: str) -> None:
        if self.close_at == moment:
            self.close_at = None
            self.closes += 1
            await self.disconnect()

    def open_connections(self) -> int:
        """How many of its connections are connected."""
        every = [*self._available_connections, *self._in_use_connections]
        return sum(1 for connection in every if connection.is_connected)


class SlowToConnect(redis.asyncio.Connection):
    """A connection that takes `delay` seconds more to connect (a loaded machine, a server
    far away): a call on a new one reaches its server that much later. For a client of
    its own: `redis.asyncio.Redis.from_url(url, connection_class=SlowToConnect)`."""

    delay = 0.5

    async def connect(self, *args: Any, **kwargs: Any) -> None:
        if not self.is_connected:
            await asyncio.sleep(self.delay)
        await super().connect(*args, **kwargs)  # type: ignore[no-untyped-call]
