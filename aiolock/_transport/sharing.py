"""Which calls of a transport go on a shared connection, and on which (`Sharing`).

A transport counts its calls under way; a call made while another is under way, that
waits only for its one reply (no `WAIT` after it, no caller going on once it is written),
goes on the `SharedConnection` of the source its connection would come from (a pool of
the user's client), taken from that source when none is in use. A
lone call keeps a connection of its own: sharing would only cost it the bookkeeping.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from .base import DRAIN_ABOVE, Command, pack
from .replies import direct_reader
from .shared_connection import GiveBack, SharedConnection
from .write_batch import WriteBatch

__all__ = ("Sharing", "Take")

Take = Callable[[Any], Awaitable[tuple[Any, GiveBack]]]
"""How a connection is taken from a source (connected), and how it goes back."""


class Sharing:
    """The shared connections of one transport, one per source in use, and its calls
    under way (see the module)."""

    __slots__ = ("_apart", "_in_use", "_making", "enabled", "under_way")

    def __init__(self) -> None:
        self.enabled = True
        """Whether calls may share connections: not a Redlock node's, whose give-back
        must not queue behind a call the network holds up on that node (each of its calls
        fails apart, within the node's own bound)."""
        self.under_way = 0
        """The transport's calls sent and not yet answered (or being sent): the transport
        counts them."""
        self._in_use: dict[int, SharedConnection] = {}
        """The shared connection of each source (by its id) while calls wait on it."""
        self._making: dict[int, asyncio.Future[None]] = {}
        """A shared connection being taken from each source (its connection made, say)."""
        self._apart: weakref.WeakSet[Any] = weakref.WeakSet()
        """The sources whose connections cannot be shared."""

    def wanted(self, source: Any) -> bool:
        """Whether a call (counted in `under_way`) on a connection of `source` goes on
        a shared one: one is in use, or another call is under way."""
        return id(source) in self._in_use or (self.enabled and self.under_way > 1)

    async def route(
        self, source: Any, take: Take, command: Command
    ) -> tuple[SharedConnection, bytes] | None:
        """The shared connection of `source` for `command` (taken by `take` if none is in
        use), and the command packed; None if it goes on a connection of its own (its
        source's cannot be shared, or it is large enough for its write to wait for the
        socket to drain)."""
        shared = self._in_use.get(id(source))
        if shared is None:
            shared = await self.share(source, take)
            if shared is None:
                return None
        packed = pack(command)
        return (shared, packed) if len(packed) < DRAIN_ABOVE else None

    async def share(self, source: Any, take: Take) -> SharedConnection | None:
        """A new shared connection taken from `source` by `take`, or None if its
        connections cannot be shared (not read straight from hiredis: `replies`), or, for a
        call that came while another took one, if that one could not. Calls that come
        while one is taken wait for it (a source with no idle connection makes one)."""
        key = id(source)
        making = self._making.get(key)
        if making is not None:
            await asyncio.wait((making,))
            return self._in_use.get(key)
        if source in self._apart:
            return None
        making = self._making[key] = asyncio.get_running_loop().create_future()
        try:
            connection, give_back = await take(source)
            if not connection.is_connected or direct_reader(connection) is None:
                await give_back(connection)
                if connection.is_connected:
                    self._apart.add(source)
                return None
            return SharedConnection(connection, give_back, key=key, in_use=self._in_use)
        finally:
            del self._making[key]
            making.set_result(None)

    @staticmethod
    async def call(shared: SharedConnection, packed: bytes, batch: WriteBatch) -> Any:
        """`packed`'s reply, on `shared` (`SharedConnection.call`)."""
        batch.awaiting += 1  # (what a loop that hides its ready callbacks batches by)
        try:
            return await shared.call(packed, batch)
        finally:
            batch.awaiting -= 1
