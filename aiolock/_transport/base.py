"""What every transport shares: the low-level sends, and the `Transport` a `Backend` holds.

A `Transport` is how one user client's script calls reach its server(s): the part of a
`Backend` (`_transport.backend`) that differs by deployment. The `Backend` bounds and retries every
call, translates its errors and runs scripts; the transport says on which client a call
goes (`script_client`, or `call_on` for a client it lends per call), how a command is sent
on it (`send`), which connections aiolock opens for itself (`connection_pool`,
`background_client`, `new_pubsub`), and the few facts of its topology the bounded call
asks (`retries_broken`, `waits_out`, `during_migration`).

- `CommandTransport` (here): through the client's `execute_command`, for any client aiolock
  does not send on itself (fakeredis, a connection class of another kind);
- `DirectTransport` (`_transport.direct`): packed by hiredis on a pooled connection;
- `SentinelTransport` (`_transport.sentinel`): to the master the Sentinels name now;
- `ClusterTransport` (`_transport.cluster`): routed by slot through a cluster client of
  aiolock's own.

A deployment of another shape (several independent servers, say) is one more transport.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import inspect
import math
import types
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ClassVar, Final, cast

import redis
import redis.asyncio
import redis.exceptions
from redis.asyncio.client import PubSub

from .._lua.lock import Script
from .clients import REDIS, Client, ClientLibrary, Errors, closed_transport, valkey_libraries
from .replies import direct_reader
from .write_batch import WriteBatch, batch_for

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency, but may be missing
    hiredis = None  # type: ignore[assignment]

__all__ = (
    "DRAIN_ABOVE",
    "PACKS",
    "Call",
    "Command",
    "CommandTransport",
    "Sent",
    "Transport",
    "checkin",
    "checkout",
    "exchange_packed",
    "pack",
    "pooled",
    "read_pair",
    "reader",
    "write",
)

Command = tuple[str | int, ...]

Call = tuple[Sequence[str], Sequence[str | int]]
"""One script call's KEYS and ARGV."""

Sent = Callable[[], None] | None
"""Called once the command has been written (on the direct and Sentinel paths; through
`execute_command`, just before redis-py is handed it)."""


PACKS: Final = hiredis is not None
"""Whether hiredis is there to pack commands (`pack`), as sending directly requires."""


def pack(command: Command) -> bytes:
    """`command` packed by hiredis (which the transports that send directly require)."""
    packed: bytes = hiredis.pack_command(command)  # type: ignore[arg-type]
    return packed


def pooled(pool: Any, command: str) -> Awaitable[Any]:
    """A connection of `pool` (named by the command, for the pools that want that)."""
    if "get_connection" in getattr(pool, "__dict__", ()):  # replaced on this pool object
        if _names_connections(pool):
            return cast(Awaitable[Any], pool.get_connection(command))
        return cast(Awaitable[Any], pool.get_connection())
    checkout = _CHECKOUTS.get(type(pool))
    if checkout is None:
        checkout = _CHECKOUTS[type(pool)] = _checkout(pool)
    return checkout(pool, command)


async def checkout(pool: Any, command: str) -> tuple[Any, bool]:
    """A connection of `pool`, and whether it was taken past redis-py's checkout (`checkin`
    then gives it back the same way).

    redis-py's `ConnectionPool.get_connection` and `release` take a lock, record metrics,
    dispatch events and ask the connection to connect, around a list pop and a set add:
    in a lock cycle those layers cost about as much as aiolock's own work on the call. A
    plain pool of redis-py's own class (`_quick`) lends an idle connection directly: one
    that is connected and has nothing unread (what redis-py checks); any other case takes
    redis-py's way.
    """
    available = pool._available_connections if _quick(pool) else None
    if available:
        connection = available.pop()
        in_use = pool._in_use_connections
        in_use.add(connection)
        try:
            # (`can_read`: a look at what was buffered, which never waits; the older
            # `can_read_destructive` reads from the socket, so its pools are not lent here)
            clean = connection.is_connected and not await connection.can_read()
        except (redis.exceptions.RedisError, OSError):
            clean = False
        except BaseException:
            in_use.discard(connection)
            available.append(connection)
            raise
        if clean:
            return connection, True
        in_use.discard(connection)
        available.append(connection)  # redis-py's checkout reconnects it
    return await pooled(pool, command), False


async def checkin(pool: Any, connection: Any, quick: bool) -> None:
    """Give back a connection from `checkout`. One that was closed goes behind the idle
    ones of a pool `checkout` lends from (`_quick`), so that the next calls take a
    connected one before any is connected again (a server that refuses new connections
    still answers on those)."""
    if not quick:
        await pool.release(connection)
    else:
        if getattr(connection, "_should_reconnect", False):
            await connection.disconnect()
        in_use = pool._in_use_connections
        if connection not in in_use:  # the pool was reset meanwhile: no longer its own
            await connection.disconnect()
            return
        in_use.remove(connection)
        pool._available_connections.append(connection)
    if not connection.is_connected and _quick(pool):
        available = pool._available_connections
        if len(available) > 1 and available[-1] is connection:
            available.insert(0, available.pop())


def _quick(pool: Any) -> bool:
    """Whether `checkout` may lend `pool`'s connections itself: redis-py's own pool class,
    its methods not replaced on the object, no credential provider (whose re-authentication
    runs when a connection is given back), RESP2 (no push notifications between commands),
    and connections that can tell whether anything is buffered without reading (redis-py 8).
    What the pool was made with is looked at once (`_QUICK_POOLS`); its methods every time.
    """
    if type(pool) is not redis.asyncio.ConnectionPool:
        return False
    own = vars(pool)
    if "get_connection" in own or "release" in own:
        return False
    made = _QUICK_POOLS.get(pool)
    if made is None:
        kwargs = pool.connection_kwargs
        made = _QUICK_POOLS[pool] = (
            kwargs.get("credential_provider") is None
            and kwargs.get("protocol") in (None, 2, "2")
            and hasattr(pool.connection_class, "can_read")
        )
    return (
        made
        and type(own.get("_available_connections")) is list
        and type(own.get("_in_use_connections")) is set
    )


_QUICK_POOLS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
"""Whether each pool was made so that `checkout` may lend its connections (see `_quick`)."""


_CHECKOUTS: dict[type[Any], Callable[[Any, str], Awaitable[Any]]] = {}
"""How a connection is taken from a pool of each class (see `_checkout`)."""


def _checkout(pool: Any) -> Callable[[Any, str], Awaitable[Any]]:
    """How to take a connection from a pool of `pool`'s class: its `get_connection`, called
    past the wrapper redis-py 5.3+ puts around it (`deprecated_args`, which warns about
    arguments aiolock never passes, at the cost of a coroutine and a dict per call). Any
    other wrapper (instrumentation, say) is called as it is."""
    method = type(pool).get_connection
    inner = getattr(method, "__wrapped__", None)
    if (
        type(method) is types.FunctionType
        and method.__code__.co_name == "async_wrapper"
        and type(inner) is types.FunctionType
        and inner.__name__ == "get_connection"
        and inspect.iscoroutinefunction(inner)
    ):
        method = inner
    get: Callable[..., Awaitable[Any]] = method
    if _names_connections(pool):
        return get
    return lambda pool, command: get(pool)


def _names_connections(pool: Any) -> bool:
    if isinstance(pool, redis.asyncio.ConnectionPool):
        return REDIS.names_connections
    return any(
        isinstance(pool, lib.connection_pool) and lib.names_connections
        for lib in valkey_libraries()
    )


DRAIN_ABOVE: Final = 65536
"""Bytes buffered in a connection's transport above which a write waits for them to drain."""


async def write(
    connection: redis.asyncio.connection.AbstractConnection,
    packed: bytes,
    on_sent: Sent,
    batch: WriteBatch,
) -> None:
    """Write `packed` on `connection` as its `send_packed_command` would, without the task
    redis-py's socket timeout wraps around every write on Python 3.11 (`asyncio.wait_for`):
    aiolock bounds the whole call itself. A connection that checks its health before
    writes (`health_check_interval`), or without a stream writer, goes redis-py's way.
    `on_sent` is called once it is written.

    A command whose caller waits only for its reply may be held to the end of the event
    loop's pass and written there with the others of the pass (`batch`); one whose
    caller goes on once it is written (`on_sent`: a body that starts once its hand-over's
    renewal is written), or one large enough to need a drain, is written at once.

    On any error the connection is closed, as redis-py closes it."""
    writer: asyncio.StreamWriter | None = getattr(connection, "_writer", None)
    if writer is None or getattr(connection, "health_check_interval", None):
        await connection.send_packed_command(packed)
    elif on_sent is not None or len(packed) >= DRAIN_ABOVE or not batch.hold(writer, packed):
        try:
            writer.write(packed)
            if writer.transport.get_write_buffer_size() > DRAIN_ABOVE:
                await writer.drain()
        except OSError as exc:
            await connection.disconnect(nowait=True)
            raise redis.exceptions.ConnectionError(
                f"error while writing to the socket: {exc}"
            ) from exc
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
    if on_sent is not None:
        on_sent()


_NO_READ_TIMEOUT: Final = 1e9
"""The read timeout aiolock's calls pass to a connection whose client has a socket timeout:
none that matters (every call is bounded as a whole by aiolock). A socket timeout shorter
than an event-loop stall would fire as the loop resumes, before the reply that arrived
during the stall is read, and drop it (a renewal Redis confirmed, counted as missing). A
finite number: some event loops cannot schedule a timer at infinity."""


def _reads_unbounded_at_inf(version: str) -> bool:
    """Whether redis-py `version` reads with no timer at all when given `math.inf` as the
    read timeout (8.1 and later; its default socket timeout is 5 s since 8.0, so every
    read would otherwise arm and cancel a timer of its own)."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (8, 1)


_UNBOUNDED_READ: Final = math.inf if _reads_unbounded_at_inf(redis.__version__) else None
"""The read timeout that means none to redis-py's own connections, if it has one."""


def reader(
    connection: redis.asyncio.connection.AbstractConnection,
) -> Callable[[], Awaitable[Any]]:
    """How to read a reply on `connection`: without its client's socket timeout, and
    straight from its hiredis reader where that reads as redis-py would (`replies`)."""
    direct = direct_reader(connection)
    if direct is not None:
        return direct
    if getattr(connection, "socket_timeout", None) is None:
        return connection.read_response
    if _UNBOUNDED_READ is not None and isinstance(
        connection, redis.asyncio.connection.AbstractConnection
    ):
        return functools.partial(connection.read_response, timeout=_UNBOUNDED_READ)
    return functools.partial(connection.read_response, timeout=_NO_READ_TIMEOUT)


async def read_pair(
    connection: redis.asyncio.connection.AbstractConnection, read: Callable[[], Awaitable[Any]]
) -> tuple[Any, Any]:
    """The replies to a command and the `WAIT` sent right after it on `connection` (read by
    `read`, see `reader`). The
    second is read even when the first is an error reply, so that no reply is left unread
    on a connection that goes back to its pool; except after NOSCRIPT: that WAIT waits for
    nothing (the script did not run) and would answer only at its timeout, leaving too
    little of the call's bound for the EVAL and its own WAIT. The connection is closed
    instead, its reply unread."""
    try:
        first = await read()
    except Errors.noscript:
        await connection.disconnect(nowait=True)
        raise
    except Errors.response as exc:
        await read()
        raise exc from None
    return first, await read()


async def exchange_packed(
    connection: redis.asyncio.connection.AbstractConnection,
    packed: bytes,
    on_sent: Sent,
    *,
    pair: bool,
    send: Callable[
        [redis.asyncio.connection.AbstractConnection, bytes, Sent, WriteBatch], Awaitable[None]
    ],
    batch: WriteBatch,
) -> Any:
    """Write `packed` (a command, and a `WAIT` after it if `pair`) on `connection` with
    `send` (which calls `on_sent` once it is written, and may hold it to the end of the
    loop's pass in `batch`, the running loop's), and read its reply (both, if `pair`:
    `read_pair`) without the client's socket timeout (`reader`). A write the event loop
    refused on a connection the server had reset is raised as a `ConnectionError` (see
    `closed_transport`).

    On any error or cancellation while sending or reading, redis-py's connection closes
    itself, so a half-read reply never goes back to its pool.
    """
    batch.awaiting += 1  # (what a loop that hides its ready callbacks batches by)
    try:
        await send(connection, packed, on_sent, batch)
        read = reader(connection)
        if pair:
            return await read_pair(connection, read)
        return await read()
    except (RuntimeError, AttributeError, TypeError) as exc:
        if not closed_transport(exc):
            raise
        raise redis.exceptions.ConnectionError(f"the connection was closed: {exc!r}") from exc
    finally:
        batch.awaiting -= 1


class Transport(abc.ABC):
    """How one client's script calls reach its server(s); see the module docstring.

    Holds the client weakly (the `Backend` does too), and keeps the user's connection
    settings, so that a lingering background task never needs the client itself.
    """

    sees_writes: ClassVar[bool] = True
    """Whether `send` calls `on_sent` once the command was written (aiolock sends it on a
    connection itself; or, a call it cannot, once answered), rather than when redis-py is
    handed it (`execute_command`)."""
    sentinel: ClassVar[bool] = False
    """Whether the client is a Sentinel-managed one (`Sentinel.master_for`)."""
    cluster: ClassVar[bool] = False
    """Whether the client is a cluster's: a script call's keys must then share one slot."""
    retries_broken: ClassVar[bool] = False
    """Whether a call on a broken connection is sent again as often as its bound allows
    (else once, at once)."""

    __slots__ = (
        "_client_ref",
        "_renew_client",
        "batch",
        "connection_class",
        "connection_kwargs",
        "library",
        "loop",
    )

    def __init__(
        self,
        library: ClientLibrary,
        client: weakref.ref[Client],
        *,
        connection_class: type[redis.asyncio.connection.AbstractConnection],
        connection_kwargs: dict[str, Any],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.library = library
        self._client_ref = client
        self.connection_class = connection_class
        self.connection_kwargs = connection_kwargs
        self.loop = loop
        self.batch = batch_for(loop)
        """The commands `loop` holds to the end of its pass (`_transport.write_batch`)."""
        self._renew_client: redis.asyncio.Redis | None = None

    @classmethod
    def for_client(
        cls, library: ClientLibrary, client: redis.asyncio.Redis, loop: asyncio.AbstractEventLoop
    ) -> Transport:
        """The transport of a client of one server: aiolock's own connections use the
        client's settings, without its retries."""
        pool = client.connection_pool
        kwargs = dict(pool.connection_kwargs)
        kwargs["retry"] = library.no_retry()
        return cls(
            library,
            weakref.ref(client),
            connection_class=pool.connection_class,
            connection_kwargs=kwargs,
            loop=loop,
        )

    def user_client(self) -> Client:
        """The user's client (held weakly: locks hold it strongly)."""
        client = self._client_ref()
        if client is None:  # pragma: no cover - locks keep their client alive
            raise RuntimeError("the redis client of this lock was garbage-collected")
        return client

    @abc.abstractmethod
    async def send(
        self, client: Client, command: Command, on_sent: Sent, then: Command | None = None
    ) -> Any:
        """One command (and `then` right after it, both replies returned) on `client`."""

    def script_client(self, *, background: bool) -> Client | None:
        """The client a script call goes on: the user's, or for a `background` call (a
        renewal) aiolock's own connections, never busy with the user's commands; None if
        the transport lends one for each call (`call_on`)."""
        if background:
            return self.background_client()
        client = self._client_ref()
        if client is None:  # pragma: no cover - locks keep their client alive
            raise RuntimeError("the redis client of this lock was garbage-collected")
        return client

    def call_on(
        self, call: Callable[[Client], Awaitable[Any]], *, background: bool
    ) -> Awaitable[Any]:
        """`call` run on the client a script call goes on (see `script_client`)."""
        client = self.script_client(background=background)
        assert client is not None
        return call(client)

    def connection_pool(self, key: str | None = None) -> redis.asyncio.ConnectionPool:
        """A new pool with the user's connection settings and no retries of its own."""
        return self.library.connection_pool(
            connection_class=self.connection_class, **self.connection_kwargs
        )

    def background_client(self) -> Client:
        if self._renew_client is None:
            self._renew_client = self.library.client(connection_pool=self.connection_pool())
        return self._renew_client

    async def close_background(self) -> None:
        """Close the renewal connections; called when no lease needs renewing."""
        client, self._renew_client = self._renew_client, None
        if client is not None:
            await client.connection_pool.disconnect()

    def new_pubsub(self) -> PubSub:
        """A pub/sub session on a connection of its own."""
        return self.library.pubsub(connection_pool=self.connection_pool())

    async def master_moved(self, pubsub: PubSub) -> bool:
        """Whether `pubsub`'s connection is open to a former master (Sentinel only)."""
        return False

    def waits_out(self, error: BaseException) -> bool:
        """Whether a call refused with `error` is sent again after a pause, within its
        bound (a cluster slot that migrates): noted as met."""
        return False

    def during_migration(self, waiting_out: bool) -> bool:
        """Whether a call that failed now is taken for a consequence of a migration."""
        return False

    @contextlib.asynccontextmanager
    async def node_clients(self, key: str | None) -> AsyncIterator[list[redis.asyncio.Redis]]:
        """A client of the one server holding `key` (None: of every primary): the user's
        client here; a cluster's transport opens clients of its own, closed on exit."""
        client = self.user_client()
        assert isinstance(client, self.library.client)
        yield [client]

    async def run_each(
        self,
        script: Script,
        calls: Sequence[Call],
        *,
        call: Callable[..., Awaitable[Any]],
        send_once: Callable[..., Awaitable[Any]],
        timeout: float,
        operation: str,
        split: Callable[[Sequence[str], Sequence[str | int]], list[Call]] | None,
    ) -> list[Any]:
        """Several calls of one script, in one round trip per node (a cluster's only)."""
        raise TypeError("several script calls in one round trip are sent on a cluster only")


class CommandTransport(Transport):
    """Through the client's `execute_command`: any client aiolock does not send on itself
    (fakeredis, a connection class of another kind, another encoding)."""

    sees_writes = False
    __slots__ = ()

    async def send(
        self, client: Client, command: Command, on_sent: Sent, then: Command | None = None
    ) -> Any:
        # Called before redis-py is handed the command: when it is written is not known here
        # (see `sees_writes`).
        if on_sent is not None:
            on_sent()
        try:
            if then is not None:
                # Both on one connection, in one round trip (not a transaction: WAIT may not run
                # in one).
                async with client.pipeline(transaction=False) as pipe:
                    pipe.execute_command(*command)
                    pipe.execute_command(*then)
                    first, acked = await pipe.execute(raise_on_error=False)
                for reply in (first, acked):
                    if isinstance(reply, Exception):
                        raise reply
                return first, acked
            executor: Any = client  # redis-py types one client's execute_command, not the other's
            return await executor.execute_command(*command)
        except (RuntimeError, AttributeError, TypeError) as exc:
            if not closed_transport(exc):
                raise
            raise redis.exceptions.ConnectionError(f"the connection was closed: {exc!r}") from exc
