"""One pooled connection that carries the script calls of many tasks at once.

A call on a connection of its own costs the client a pool checkout and return, a write and
a read, each read a wake-up of its own: with many tasks, each on a name of its own, that is
most of the client's work. The calls on a `SharedConnection` are written together at the
end of the event loop's pass (`WriteBatch`, one write for all of them), and their replies,
read together, are handed out in the order the calls were written.

Reading needs no task of its own. The first caller that finds nobody reading reads (the
leader): it hands each reply it reads to its caller until it reads its own, hands out what
is already buffered, and names one of the callers still waiting the next leader. A lone
call is thus read by its own caller, as on a connection of its own.

Cancellation: a caller that gives up on its reply (cancelled, or its bound expired) keeps
its place in line: its reply is read and dropped when it comes; a leader names the next
one before it goes. If nothing was answered on the connection since the call was queued,
the server may have stopped answering: the connection is then retired, as redis-py closes
a connection whose read was cancelled.

Errors: an error reply goes to its caller alone. A broken connection (closed, a socket
error, a reply that cannot be parsed, a connection-level error reply such as LOADING) and a
retirement fail every call still waiting with a `ConnectionError` (the outcome of each
unknown, as on any broken connection).

Lifetime: the connection is taken from the client's pool for a run of calls, and stays
checked out while any call waits on it, so that closing the client (or its pool) closes it
too. Once none waits, it goes back to the pool: as it is if every reply was read, else
closed (a reply nobody waits for must not reach the next user of the connection). The next
call takes one again (a lone call thus uses a connection as it would on its own).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any, Final

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from .clients import closed_transport
from .replies import CLOSED, MORE, next_reply, raise_connection_level
from .write_batch import WriteBatch

__all__ = ("GiveBack", "SharedConnection")

GiveBack = Callable[[Any], Awaitable[None]]
"""How a connection goes back to where it was taken from (open, or closed)."""


_LEAD: Final = object()
"""The result of the future of a caller that reads (the leader): given by the leader before
it, or by itself (then nobody else reads, nor hands it a reply)."""


class SharedConnection:
    """One connection of a pool carrying many calls (see the module)."""

    __slots__ = (
        "_answered",
        "_connection",
        "_give_back",
        "_in_use",
        "_key",
        "_reading",
        "_waiting",
        "retired",
    )

    def __init__(
        self,
        connection: Any,
        give_back: GiveBack,
        *,
        key: int = 0,
        in_use: dict[int, SharedConnection] | None = None,
    ) -> None:
        """`connection` (connected, read straight from its hiredis reader: `replies`) is
        given back by `give_back` once no call waits on it, or closed once it broke. While
        it takes calls, it is `in_use`'s entry `key`."""
        self._connection = connection
        self._give_back = give_back
        self._in_use = in_use
        self._key = key
        if in_use is not None:
            in_use[key] = self
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        """The calls written and not yet answered, in the order they were written."""
        self._reading = False
        """Whether a caller reads (or was named to)."""
        self._answered = 0
        """Replies read on the connection so far."""
        self.retired = False
        """Whether it takes no more calls (given back, or broken): the next call takes a
        connection again."""

    async def call(self, packed: bytes, batch: WriteBatch) -> Any:
        """Write `packed` (one command) and return its reply; see the module for how, and
        for cancellation. Raises the command's error reply, or `ConnectionError`."""
        mine = asyncio.get_running_loop().create_future()
        queued_at = self._answered
        try:
            self._write(packed, batch)
        except RedisConnectionError as exc:
            await self._retire(exc)
            raise
        self._waiting.append(mine)
        try:
            if self._reading:
                outcome = await mine
                if outcome is not _LEAD:
                    return outcome
            else:
                self._reading = True
                mine.set_result(_LEAD)
            return await self._lead(mine)
        except asyncio.CancelledError:
            if not self.retired:
                if self._answered == queued_at:
                    await self._retire(RedisConnectionError("no reply since a call was given up"))
                elif mine.done() and not mine.cancelled() and mine.result() is _LEAD:
                    await self._hand_on()  # the leader goes: the next one reads
            raise

    def _write(self, packed: bytes, batch: WriteBatch) -> None:
        writer = self._connection._writer
        if self.retired or writer is None or writer.transport.is_closing():
            raise RedisConnectionError(CLOSED)
        if batch.hold(writer, packed):
            return
        try:
            writer.write(packed)
        except OSError as exc:
            raise RedisConnectionError(f"error while writing to the socket: {exc}") from exc
        except (RuntimeError, AttributeError, TypeError) as exc:
            if not closed_transport(exc):
                raise
            raise RedisConnectionError(f"the connection was closed: {exc!r}") from exc

    async def _lead(self, mine: asyncio.Future[Any]) -> Any:
        """Read, handing each reply to its caller, until `mine`'s; then hand out what is
        buffered, and hand the reading on (`_hand_on`)."""
        try:
            while True:
                if self.retired:
                    raise RedisConnectionError(CLOSED)
                reply = await self._next_reply()
                call = self._waiting.popleft()
                if call is mine:
                    await self._hand_out_buffered()
                    await self._hand_on()
                    if isinstance(reply, ResponseError):
                        raise reply
                    return reply
                _settle(call, reply)
        except (asyncio.CancelledError, ResponseError):
            raise  # (a cancelled leader hands on in `call`)
        except BaseException as exc:
            await self._retire(exc)
            raise

    async def _next_reply(self) -> Any:
        """The next reply read on the connection: an error reply returned, not raised; a
        broken connection raised as `ConnectionError`."""
        connection = self._connection
        try:
            reply = await next_reply(connection._parser)
        except OSError as exc:
            raise RedisConnectionError(
                f"Error while reading from {connection._host_error()} : {exc.args}"
            ) from exc
        self._answered += 1
        return reply

    async def _hand_out_buffered(self) -> None:
        """Hand out the replies already read, without reading more."""
        parser = self._connection._parser
        waiting = self._waiting
        push = getattr(parser, "_hiredis_PushNotificationType", None)
        while waiting:
            reply = parser._reader.gets()
            if reply is MORE:
                return
            if push is not None and isinstance(reply, push):
                await parser.handle_push_response(reply)
                continue
            try:
                raise_connection_level(reply)
            except RedisConnectionError as exc:
                await self._retire(exc)
                return
            self._answered += 1
            _settle(waiting.popleft(), reply)

    async def _hand_on(self) -> None:
        """Name the first caller still waiting the next leader. With none, the connection
        goes back to its pool: as it is if no reply is due, else closed (a reply nobody
        waits for must not reach the next user)."""
        if self.retired:
            return
        for call in self._waiting:
            if not call.done():
                call.set_result(_LEAD)
                return
        self._reading = False
        if self._waiting:
            await self._retire(RedisConnectionError("replies due to calls given up"))
            return
        self._take_no_more()
        await self._give_back(self._connection)

    def _take_no_more(self) -> None:
        self.retired = True
        in_use = self._in_use
        if in_use is not None and in_use.get(self._key) is self:
            del in_use[self._key]

    async def _retire(self, cause: BaseException) -> None:
        """Take no more calls, fail the waiting ones, and give the connection back closed."""
        if self.retired:
            return
        self._take_no_more()
        self._reading = False
        waiting, self._waiting = self._waiting, collections.deque()
        for call in waiting:
            if not call.done():
                error = RedisConnectionError(f"the shared connection broke: {cause!r}")
                call.set_exception(error)
        connection = self._connection
        await connection.disconnect(nowait=True)
        await self._give_back(connection)


def _settle(call: asyncio.Future[Any], reply: Any) -> None:
    """Hand `reply` to the caller waiting on `call`, unless it gave up."""
    if call.done():
        return
    if isinstance(reply, ResponseError):
        call.set_exception(reply)
    else:
        call.set_result(reply)
