"""Reading one reply on a redis-py connection straight from its hiredis reader.

`Connection.read_response` reaches the bytes through three more coroutines (the
connection's, which also computes an error message before every read, the parser's, and the
parser's socket read), each a frame that every reply resumes through: in a lock cycle of
two calls those layers cost the client more than the write. `direct_reader` reads the same
way in one: the hiredis reader's next reply, else what the connection's stream has, fed to
it; a reply whose bytes are all there is not awaited at all.

Taken only where it reads as redis-py would: a connection class that reads with redis-py's
own `read_response` (not a Sentinel-managed one, which turns READONLY into a connection
error, nor one a user overrode, to instrument it say), redis-py's own hiredis parser (a
RESP3 push notification before a reply goes to its handler, as there), no health check
(which a read postpones), and a connection aiolock bounds as a whole (no read timeout: see
`base.reader`). Errors are redis-py's: the connection is closed on a broken or refused
read, a cancellation, a reply that cannot be parsed or a connection-level error reply
(LOADING, say), and left open on an error reply (`ResponseError`), which is raised.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, Final

import redis._parsers.hiredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

__all__ = ("CLOSED", "MORE", "direct_reader", "next_reply", "raise_connection_level")


_PARSER: Final[type[Any] | None] = getattr(redis._parsers.hiredis, "_AsyncHiredisParser", None)
"""redis-py's asyncio hiredis parser class."""
MORE: Final = getattr(redis._parsers.hiredis, "NOT_ENOUGH_DATA", False)
"""What its reader answers while a reply is incomplete: redis-py 6 and later name an object
of their own; before, False (which no RESP2 reply is)."""
_PROTOCOLS: Final = (None, 2, "2") if MORE is False else (None, 2, "2", 3, "3")
"""The protocols read here: RESP3 only where the reader cannot mistake a reply (RESP3 has
`false`) for an incomplete one."""
CLOSED: Final = "Connection closed by server."
"""redis-py's message for a connection the server closed."""


def direct_reader(connection: Any) -> Callable[[], Awaitable[Any]] | None:
    """How to read a reply on `connection` straight from its hiredis reader, or None if
    it must be read by its `read_response` (see the module)."""
    parser = getattr(connection, "_parser", None)
    if (
        type(parser) is not _PARSER  # (never None: without the class, nothing is)
        or not _reads_as_redis_py(type(connection))
        or connection.health_check_interval
        or connection.protocol not in _PROTOCOLS
    ):
        return None
    return functools.partial(_read, connection, parser)


def _reads_as_redis_py(kind: type[Any]) -> bool:
    """Whether connections of class `kind` read replies with redis-py's own
    `read_response`: not a class that reads its own way (a Sentinel-managed connection,
    which turns a READONLY reply into a connection error; a user's, instrumented)."""
    own = _OWN_READS.get(kind)
    if own is None:
        own = _OWN_READS[kind] = (
            issubclass(kind, AbstractConnection) and kind.read_response is _READ_RESPONSE
        )
    return own


_READ_RESPONSE: Final = AbstractConnection.read_response
_OWN_READS: dict[type[Any], bool] = {}
"""Whether each connection class reads as redis-py does (`_reads_as_redis_py`)."""


async def next_reply(parser: Any) -> Any:
    """The next reply read by a connection's redis-py hiredis `parser`, an error reply
    returned, not raised; a closed connection, or a connection-level error reply (LOADING,
    say: redis-py's parser makes those `ConnectionError`s), raised as `ConnectionError`;
    a socket's error raised as it is. A RESP3 push notification before the reply goes to
    the parser's handler."""
    if not parser._connected:
        raise RedisConnectionError(CLOSED)
    while True:
        hiredis_reader = parser._reader  # (a push's handler may have made a new one)
        reply = hiredis_reader.gets()
        while reply is MORE:
            data = await parser._stream.read(parser._read_size)
            if not data:
                raise RedisConnectionError(CLOSED)
            hiredis_reader.feed(data)
            reply = hiredis_reader.gets()
        push = getattr(parser, "_hiredis_PushNotificationType", None)
        if push is None or not isinstance(reply, push):
            break
        await parser.handle_push_response(reply)
    raise_connection_level(reply)
    return reply


def raise_connection_level(reply: Any) -> None:
    """Raise `reply` if it is a connection-level error (LOADING, say: redis-py's parser
    makes those `ConnectionError`s, which close the connection)."""
    if isinstance(reply, RedisConnectionError):
        raise reply
    if isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError):
        raise reply[0]


async def _read(connection: Any, parser: Any) -> Any:
    """The next reply on `connection`, read as `Connection.read_response` reads it with no
    timeout (the parser's reader and stream are looked up each time: a connection makes
    new ones each time it connects)."""
    try:
        reply = await next_reply(parser)
    except OSError as exc:
        await connection.disconnect(nowait=True)
        raise RedisConnectionError(
            f"Error while reading from {connection._host_error()} : {exc.args}"
        ) from exc
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
    if isinstance(reply, ResponseError):
        try:
            raise reply from None
        finally:
            del reply  # (no reference cycle through the frame)
    return reply
