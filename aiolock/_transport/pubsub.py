"""The pub/sub session aiolock's notifier reads: redis-py's `PubSub`, with the messages of
a plain subscription (or a shard channel's, on a cluster node) read straight from the
connection.

Every release that someone waits for is a message to the process it concerns. redis-py
reads each through its retry layer (which reconnects and subscribes again without saying
so), its observability hooks and its handler dispatch, in the task that awaits the read. Here,
on a connection read straight from its hiredis reader (`_transport.replies`, RESP2), the
bytes are parsed as they arrive (`_Tap`, in the event loop's callback that received them), and
a message goes at once to `deliver` (set by the notifier): the waiter it wakes runs at the
loop's next turn, with no turn of a reading task before it. Everything else (subscription
answers, PONGs, a handler's channel), and every message while something else is still to be
read before it, goes in order to `get_message`, which takes redis-py's path for it; as does
every read on a connection that cannot be tapped (redis-py's own health check, a Sentinel's
connection, another parser). A read that fails raises at once: the notifier replaces the
session and tells its waiters that a release may have been missed, which is what a silent
reconnection would have hidden.

A pub/sub made of a session per node (a cluster's, a quorum's: `_transport.cluster_pubsub`,
`_transport.quorum_pubsub`) reads each node in a task of its own and hands what it reads to the
notifier through an `Inbox`.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from redis.asyncio.client import PubSub
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from .replies import CLOSED, MORE, direct_reader, raise_connection_level

__all__ = ("Inbox", "PubSubSession")

_KINDS = {
    b"message": "message",
    "message": "message",
    b"smessage": "smessage",
    "smessage": "smessage",
}
"""The kind of a plain or shard channel's message, by its first element as bytes or decoded
(`decode_responses=True`)."""

_NONE: Final[Mapping[Any, Any]] = MappingProxyType({})

Deliver = Callable[[dict[str, Any]], None]


def _message(frame: Any, handlers: Callable[[str], Mapping[Any, Any]]) -> dict[str, Any] | None:
    """`frame` as the message `get_message` returns, if it is a plain or shard channel's
    message whose channel has no handler of redis-py's (`handlers(kind)`: the channels of
    that kind), else None (it takes redis-py's path)."""
    kind = (
        _KINDS.get(frame[0])
        if isinstance(frame, list) and len(frame) == 3 and isinstance(frame[0], str | bytes)
        else None
    )
    if kind is None or handlers(kind).get(frame[1]) is not None:
        return None
    return {"type": kind, "pattern": None, "channel": frame[1], "data": frame[2]}


class PubSubSession(PubSub):
    """redis-py's `PubSub`, reading a plain subscription's messages itself (see above).

    `deliver`, when set, is given each message as it is read (see `_Tap`), in the event
    loop's callback that received it; it must not block, and what it raises is raised by the
    next `get_message`, the connection closed."""

    deliver: Deliver | None = None
    _tap: _Tap | None = None

    async def aclose(self) -> None:
        """Close the session; nothing it still reads goes to `deliver` any more."""
        self.deliver = None
        await super().aclose()

    def _handlers(self, kind: str) -> Mapping[Any, Any]:
        # (redis-py 5.0's asyncio PubSub keeps no shard channels)
        return self.channels if kind == "message" else getattr(self, "shard_channels", _NONE)

    async def get_message(
        self, ignore_subscribe_messages: bool = False, timeout: float | None = 0.0
    ) -> dict[str, Any] | None:
        """The next message, or None if none came within `timeout` seconds.

        Cancellation:
            A read cancelled midway closes the connection (nothing half-read is left on
            it); a read that timed out leaves it as it was. On a tapped connection nothing
            is half-read: a cancelled wait leaves it as it was.
        """
        connection: Any = self.connection  # (None until the first subscription)
        if (
            timeout is None
            or connection is None
            or not connection.is_connected
            or connection.health_check_interval
        ):
            message: dict[str, Any] | None = await super().get_message(
                ignore_subscribe_messages=ignore_subscribe_messages, timeout=timeout
            )
            return message
        tap = self._tapped(connection)
        if tap is not None:
            response: Any = await tap.next_frame(timeout)
        else:
            response = await connection.read_response(
                timeout=timeout, disconnect_on_error=True, push_request=True
            )
        if response is None:
            return None
        found = _message(response, self._handlers)
        if found is not None:
            return found
        handled: dict[str, Any] | None = await self.handle_message(  # type: ignore[no-untyped-call]
            response, ignore_subscribe_messages
        )
        return handled

    def _tapped(self, connection: Any) -> _Tap | None:
        """The tap on `connection`'s current stream, put on it now if it has none; None if
        nothing is to be delivered, or the connection cannot be tapped."""
        tap = self._tap
        if tap is not None and tap.taps(connection):
            return tap
        if self.deliver is None or direct_reader(connection) is None:
            return None
        tap = self._tap = _Tap.on(connection, self)
        return tap


class _Tap:
    """What arrives on one tapped connection, parsed as it arrives (see the module).

    It takes the place of the connection's stream's `feed_data` (and watches its end):
    each chunk goes to the connection's hiredis reader, each whole frame read off it either to
    the session's `deliver` (a message, while nothing read before it waits) or into `frames`,
    for `next_frame`. A frame that cannot be parsed, the end of the stream, or an error of
    `deliver` is kept, raised by `next_frame` once the frames before it are read (the
    connection is closed then).
    """

    __slots__ = (
        "_connection",
        "_error",
        "_frames",
        "_loop",
        "_parser",
        "_reader",
        "_session",
        "_stream",
        "_waiter",
    )

    def __init__(self, connection: Any, session: PubSubSession) -> None:
        parser = self._parser = connection._parser
        self._connection = connection
        self._session = session
        self._stream: asyncio.StreamReader = parser._stream
        self._reader: Any = parser._reader
        self._loop = asyncio.get_running_loop()
        self._frames: collections.deque[Any] = collections.deque()
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    @classmethod
    def on(cls, connection: Any, session: PubSubSession) -> _Tap | None:
        """A tap on `connection` (None if its stream is not asyncio's): what its stream
        already holds is read first."""
        stream: Any = connection._parser._stream
        held = getattr(stream, "_buffer", None)  # (bytes received, not yet parsed)
        if not isinstance(stream, asyncio.StreamReader) or not isinstance(held, bytearray):
            return None
        tap = cls(connection, session)
        data = bytes(held)
        held.clear()
        resume = getattr(stream, "_maybe_resume_transport", None)
        if resume is not None:  # (a stream that held too much paused its transport)
            resume()
        tap._fed(data)  # (and the frames the reader already holds)
        eof, failed = stream.feed_eof, stream.set_exception

        def feed_eof() -> None:
            eof()
            tap._ended(RedisConnectionError(CLOSED))

        def set_exception(exc: Exception) -> None:
            failed(exc)
            error = RedisConnectionError(f"Error while reading from the pub/sub connection: {exc}")
            error.__cause__ = exc
            tap._ended(error)

        stream.feed_data = tap._fed  # type: ignore[method-assign, assignment]
        stream.feed_eof = feed_eof  # type: ignore[method-assign]
        stream.set_exception = set_exception  # type: ignore[method-assign]
        if stream.at_eof():
            tap._ended(RedisConnectionError(CLOSED))
        return tap

    def taps(self, connection: Any) -> bool:
        """Whether this is the tap on `connection`'s current stream."""
        return getattr(getattr(connection, "_parser", None), "_stream", None) is self._stream

    def _fed(self, data: bytes) -> None:
        """The stream received `data` (see the class)."""
        if self._error is not None:
            return
        reader = self._reader
        try:
            if data:
                reader.feed(data)
            frame = reader.gets()
            while frame is not MORE:
                if not self._delivered(frame):
                    self._frames.append(frame)
                elif self._failed():
                    break
                frame = reader.gets()
        except Exception as exc:  # noqa: BLE001 - hiredis: bytes that are no reply
            error = RedisConnectionError(f"unreadable reply on the pub/sub connection: {exc}")
            error.__cause__ = exc
            self._error = error
        self._wake()

    def _delivered(self, frame: Any) -> bool:
        """Whether `frame` went to `deliver`: a message, nothing read before it waiting."""
        session = self._session
        deliver = session.deliver
        if deliver is None or self._frames:
            return False
        message = _message(frame, session._handlers)
        if message is None:
            return False
        try:
            deliver(message)
        except Exception as exc:  # noqa: BLE001 - raised by next_frame, in the reading task
            self._error = exc
        return True

    def _failed(self) -> bool:
        return self._error is not None

    def _ended(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done() and (self._frames or self._error):
            waiter.set_result(None)

    async def next_frame(self, timeout: float) -> Any:
        """The next frame not delivered, or None if none came within `timeout` seconds.

        Raises an error reply (`ResponseError`, the connection left open); what ended the
        stream or could not be parsed, as a `ConnectionError`, and what `deliver` raised,
        as it is (the connection closed first).

        Cancellation:
            Nothing is taken by a cancelled wait.
        """
        if not self._frames and self._error is None:
            waiter = self._waiter = self._loop.create_future()
            timer = self._loop.call_later(timeout, _time_up, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        if self._frames:
            frame = self._frames.popleft()
            if isinstance(frame, BaseException):
                try:
                    raise_connection_level(frame)
                except RedisConnectionError:
                    await self._connection.disconnect(nowait=True)
                    raise
                if isinstance(frame, ResponseError):
                    raise frame
            push = getattr(self._parser, "_hiredis_PushNotificationType", None)
            if push is not None and isinstance(frame, push):
                # (RESP3: what redis-py's read of a push does; a message comes back as it is)
                frame = await self._parser.handle_push_response(frame)
            return frame
        error = self._error
        if error is None:
            return None
        await self._connection.disconnect(nowait=True)
        raise error


def _time_up(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Inbox:
    """What the node sessions of a pub/sub made of several read, for the notifier.

    Messages, subscription confirmations and lost channels go at once to `deliver` (set by
    the notifier), in the session task that read them: each session's items keep their
    order, and a release's message wakes its waiter without a hop through the notifier's
    task (a queue, a timer and a task switch per message). The rest (a PING's answer, a
    refusal to raise) and everything while `deliver` is None is read with `get`. Once
    `closed` (the pub/sub is being closed, or replaced), nothing more is handed over: a
    session still ending must not confirm a subscription to the notifier's new pub/sub.
    """

    __slots__ = ("_queue", "closed", "deliver")

    def __init__(self) -> None:
        self._queue: asyncio.Queue[dict[str, Any] | Exception] = asyncio.Queue()
        self.deliver: Callable[[dict[str, Any]], None] | None = None
        self.closed = False

    def put(self, item: dict[str, Any] | Exception) -> None:
        """Hand `item` over (see above)."""
        if self.closed:
            return
        deliver = self.deliver
        if deliver is not None and isinstance(item, dict) and item["type"] != "pong":
            deliver(item)
        else:
            self._queue.put_nowait(item)

    async def get(self, timeout: float) -> dict[str, Any] | None:
        """The next item not delivered, or None if none came within `timeout` seconds; a
        refusal is raised.

        Cancellation:
            Nothing is taken from the inbox by a cancelled wait.
        """
        queue = self._queue
        if not queue.empty():  # (no timer for an item already there)
            item = queue.get_nowait()
        else:
            try:
                async with asyncio.timeout(timeout):
                    item = await queue.get()
            except TimeoutError:
                return None
        if isinstance(item, Exception):
            raise item
        return item
