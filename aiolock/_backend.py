"""The one seam between aiolock and redis-py (or valkey-py, its fork).

This is the only module of the core that imports `redis` (and `valkey`, only once it is given
a valkey-py client: `ClientLibrary`). It runs scripts (EVALSHA with an EVAL fallback
on NOSCRIPT), bounds every call by a timeout, and translates redis errors into
`BackendError` with the original chained. It also makes, per user client, the connections
aiolock opens for itself: background work (renewals, the pub/sub subscription) must not wait
for a free connection in the user's pool, and must not inherit the user's retry policy
(redis-py's default retries a command for up to ~10 s, longer than many leases live). What
runs on those connections (the renewal scheduler, the notifier) is `_runtime`'s.

A client of `redis.asyncio.sentinel.Sentinel(...).master_for(...)` gets Sentinel-managed
connections of its own too, in pools of their own that find the master for themselves.
Before each of aiolock's calls, on the user's pool or its own, the Sentinels are asked
where the master is (one more round trip, to a Sentinel), and a pooled connection to a
former master (one the Sentinels no longer name, which may still take writes until they
demote it) is closed and opened again to the new one.

valkey-py (`valkey.asyncio.Valkey`, `ValkeyCluster`, Sentinel's `master_for`) has redis-py's
API under other names: a client's `ClientLibrary` gives the classes aiolock makes its own
connections, pools and pub/sub sessions of, and the errors it maps. Its commands are sent
the same ways (packed by hiredis on valkey-py's own connection classes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import math
import random
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn, Protocol, cast

import redis
import redis.asyncio
import redis.exceptions
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.crc import key_slot

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency, but may be missing
    hiredis = None  # type: ignore[assignment]

from ._retry import Backoff
from ._scripts import Script
from ._settle import after_arrivals
from .errors import BackendError

logger = logging.getLogger("aiolock")

__all__ = (
    "AsyncClient",
    "AsyncRedis",
    "Backend",
    "Client",
    "ClientLibrary",
    "ValkeyClient",
    "check_client",
    "is_cluster",
    "library_of",
    "migrating",
    "outcome_unknown",
    "translate_errors",
)

AsyncRedis = redis.asyncio.Redis
"""A client of one server, as aiolock's code types it: redis-py's; valkey-py's
`valkey.asyncio.Valkey` has the same API (and is typed as this inside aiolock)."""


class ValkeyClient(Protocol):
    """valkey-py's asyncio clients, `valkey.asyncio.Valkey` and `ValkeyCluster`, as
    aiolock's signatures accept them: by their shape, so that aiolock's types need no
    valkey import (an installed valkey-py is imported only once a client of it is given).
    Which classes are taken is checked when the client is given (`check_client`)."""

    async def aclose(self) -> None: ...

    async def execute_command(self, *args: Any, **options: Any) -> Any: ...


AsyncClient = redis.asyncio.Redis | RedisCluster | ValkeyClient
"""What the primitives take: a client of one server (or of Sentinel's master), or of a
Redis Cluster; redis-py's, or valkey-py's."""

Client = redis.asyncio.Redis | RedisCluster
"""A client once checked (`check_client`), as aiolock's code types it: valkey-py's clients
have redis-py's API, and are typed as redis-py's inside aiolock."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientLibrary:
    """The classes of one client library: redis-py, or valkey-py (its fork, the same API
    under other names). Typed as redis-py's inside aiolock."""

    name: str
    """What messages call it: "redis-py", "valkey-py"."""
    client: type[redis.asyncio.Redis]
    cluster: type[RedisCluster]
    sync_clients: tuple[type, ...]
    """Its synchronous clients, refused with advice."""
    connection_pool: type[redis.asyncio.ConnectionPool]
    sentinel_pool: type[SentinelConnectionPool]
    pubsub: type[PubSub]
    no_retry: Callable[[], Retry]
    """A retry policy that does not retry (aiolock's own connections)."""
    direct: set[type[Any]]
    """Its connection classes that aiolock sends its commands on directly."""
    connection_module: str
    """The module of its asyncio connections (see `_closed_transport`)."""
    names_connections: bool
    """Whether its pools' `get_connection` requires a command name."""
    error: type[Exception]
    response_error: type[Exception]
    noscript_error: type[Exception]
    connection_error: type[Exception]
    timeout_error: type[Exception]
    cluster_error: type[Exception]
    """What its cluster client raises besides its errors: a command it could not route
    (no node for the slot, redirections exhausted, keys in several slots)."""
    try_again_error: type[Exception]
    """A cluster's refusal of a command while its slot migrates (TRYAGAIN)."""
    cluster_failure_error: type[Exception]
    """Its cluster client giving up on a command ("TTL exhausted", among others)."""
    ssl_connection: type[Any]
    """Its TLS connection class."""
    advice: str = field(default="")
    """How to create an asyncio client of it, for an error message."""


def _takes_command_name(pool: type[Any]) -> bool:
    """redis-py before 5.3 (and valkey-py) requires a command name in `get_connection`;
    later redis-py warns."""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    return parameter is not None and parameter.default is inspect.Parameter.empty


DIRECT_CONNECTIONS: set[type[redis.asyncio.connection.AbstractConnection]] = {
    redis.asyncio.Connection,
    redis.asyncio.SSLConnection,
    redis.asyncio.UnixDomainSocketConnection,
}
"""Connection classes aiolock sends its commands on directly: redis-py's own (and, in
aiolock's tests, one that records what is sent)."""

REDIS: Final = ClientLibrary(
    name="redis-py",
    client=redis.asyncio.Redis,
    cluster=RedisCluster,
    sync_clients=(redis.Redis, redis.RedisCluster),
    connection_pool=redis.asyncio.ConnectionPool,
    sentinel_pool=SentinelConnectionPool,
    pubsub=PubSub,
    no_retry=lambda: Retry(NoBackoff(), 0),
    direct=DIRECT_CONNECTIONS,
    connection_module="redis.asyncio.connection",
    names_connections=_takes_command_name(redis.asyncio.ConnectionPool),
    error=redis.exceptions.RedisError,
    response_error=redis.exceptions.ResponseError,
    noscript_error=redis.exceptions.NoScriptError,
    connection_error=redis.exceptions.ConnectionError,
    timeout_error=redis.exceptions.TimeoutError,
    cluster_error=redis.exceptions.RedisClusterException,
    try_again_error=redis.exceptions.TryAgainError,
    cluster_failure_error=redis.exceptions.ClusterError,
    ssl_connection=redis.asyncio.SSLConnection,
    advice="redis.asyncio.Redis(...), redis.asyncio.from_url(...) or redis.asyncio.RedisCluster(...)",
)


def _load_valkey() -> ClientLibrary:
    """valkey-py's classes (imported now: a client of it was given, so it is installed)."""
    import valkey  # noqa: PLC0415 - imported only once a valkey-py client is given
    import valkey.asyncio  # noqa: PLC0415
    import valkey.asyncio.client  # noqa: PLC0415
    import valkey.asyncio.cluster  # noqa: PLC0415
    import valkey.asyncio.retry  # noqa: PLC0415
    import valkey.asyncio.sentinel  # noqa: PLC0415
    import valkey.backoff  # noqa: PLC0415
    import valkey.exceptions  # noqa: PLC0415

    connections: Any = valkey.asyncio.connection
    return ClientLibrary(
        name="valkey-py",
        client=cast(Any, valkey.asyncio.Valkey),
        cluster=cast(Any, valkey.asyncio.cluster.ValkeyCluster),
        sync_clients=(valkey.Valkey, valkey.ValkeyCluster),
        connection_pool=cast(Any, valkey.asyncio.ConnectionPool),
        sentinel_pool=cast(Any, valkey.asyncio.sentinel.SentinelConnectionPool),
        pubsub=cast(Any, valkey.asyncio.client.PubSub),
        no_retry=lambda: cast(Retry, valkey.asyncio.retry.Retry(valkey.backoff.NoBackoff(), 0)),
        direct={
            connections.Connection,
            connections.SSLConnection,
            connections.UnixDomainSocketConnection,
        },
        connection_module="valkey.asyncio.connection",
        names_connections=_takes_command_name(valkey.asyncio.ConnectionPool),
        error=valkey.exceptions.ValkeyError,
        response_error=valkey.exceptions.ResponseError,
        noscript_error=valkey.exceptions.NoScriptError,
        connection_error=valkey.exceptions.ConnectionError,
        timeout_error=valkey.exceptions.TimeoutError,
        cluster_error=valkey.exceptions.ValkeyClusterException,
        try_again_error=valkey.exceptions.TryAgainError,
        cluster_failure_error=valkey.exceptions.ClusterError,
        ssl_connection=connections.SSLConnection,
        advice="valkey.asyncio.Valkey(...), valkey.asyncio.from_url(...) or "
        "valkey.asyncio.ValkeyCluster(...)",
    )


class _Errors:
    """The errors of every client library in use (valkey-py's from its first client on),
    for the `except` clauses here, which evaluate these when an error is raised."""

    any: tuple[type[BaseException], ...] = (REDIS.error, OSError, REDIS.cluster_error)
    """A connection that broke or a server that refused (or an unroutable cluster call)."""
    with_timeout: tuple[type[BaseException], ...] = (*any, TimeoutError)
    """`any`, and the builtin `TimeoutError` (of `asyncio.timeout`)."""
    library: tuple[type[BaseException], ...] = (REDIS.error,)
    response: tuple[type[BaseException], ...] = (REDIS.response_error,)
    noscript: tuple[type[BaseException], ...] = (REDIS.noscript_error,)
    connection: tuple[type[BaseException], ...] = (REDIS.connection_error,)
    timeout: tuple[type[BaseException], ...] = (REDIS.timeout_error,)
    cluster: tuple[type[BaseException], ...] = (REDIS.cluster_error,)
    try_again: tuple[type[BaseException], ...] = (REDIS.try_again_error,)
    cluster_failure: tuple[type[BaseException], ...] = (REDIS.cluster_failure_error,)
    connection_modules: tuple[str, ...] = (REDIS.connection_module,)

    @classmethod
    def add(cls, library: ClientLibrary) -> None:
        cls.any += (library.error, library.cluster_error)
        cls.with_timeout += (library.error, library.cluster_error)
        cls.library += (library.error,)
        cls.response += (library.response_error,)
        cls.noscript += (library.noscript_error,)
        cls.connection += (library.connection_error,)
        cls.timeout += (library.timeout_error,)
        cls.cluster += (library.cluster_error,)
        cls.try_again += (library.try_again_error,)
        cls.cluster_failure += (library.cluster_failure_error,)
        cls.connection_modules += (library.connection_module,)


_VALKEY: list[ClientLibrary] = []
"""valkey-py's `ClientLibrary`, once a client of it was given."""


def _valkey_library() -> ClientLibrary:
    if not _VALKEY:
        library = _load_valkey()
        _Errors.add(library)
        _VALKEY.append(library)
    return _VALKEY[0]


def _from_valkey(client: object) -> bool:
    """Whether `client`'s class comes from valkey-py (its own or a subclass of one)."""
    return any(klass.__module__.partition(".")[0] == "valkey" for klass in type(client).__mro__)


def library_of(client: object) -> ClientLibrary | None:
    """The library of `client` if it is one of its asyncio clients (of one server or of a
    cluster), else None."""
    if isinstance(client, redis.asyncio.Redis | RedisCluster):
        return REDIS
    if _from_valkey(client):
        library = _valkey_library()
        if isinstance(client, library.client | library.cluster):
            return library
    return None


def check_client(client: object) -> Client:
    """A `redis.asyncio.Redis` or `RedisCluster`, or a `valkey.asyncio.Valkey` or
    `ValkeyCluster` (typed as redis-py's: see `Client`)."""
    if library_of(client) is not None:
        return cast(Client, client)
    return _not_a_client(client)


def is_cluster(client: object) -> bool:
    """Whether `client` is a cluster client (`RedisCluster`, `ValkeyCluster`)."""
    library = library_of(client)
    return library is not None and isinstance(client, library.cluster)


def _not_a_client(client: object) -> NoReturn:
    libraries = (REDIS, _valkey_library()) if _from_valkey(client) else (REDIS,)
    for library in libraries:
        if isinstance(client, library.sync_clients):
            module = library.sync_clients[0].__module__.partition(".")[0]
            raise TypeError(
                f"client must be an asyncio client ({module}.asyncio.{type(client).__name__}), "
                f"got the synchronous {module}.{type(client).__name__}; create it with "
                f"{library.advice}"
            )
    raise TypeError(
        "client must be a redis.asyncio.Redis or RedisCluster (redis-py), or a "
        f"valkey.asyncio.Valkey or ValkeyCluster (valkey-py), got {type(client).__name__}"
    )


def _backend_error(
    operation: str, name: str | None, timeout: float, error: BaseException
) -> BackendError:
    """The `BackendError` for `error` (a redis error, an OSError, or our own timeout)."""
    what = f"{operation} of lock {name!r}" if name is not None else operation
    if isinstance(error, TimeoutError) and not isinstance(error, _Errors.library):
        return BackendError(
            f"{what}: no reply from Redis within {timeout:.3g}s", operation=operation, name=name
        )
    return BackendError(f"{what} failed: {error}", operation=operation, name=name)


@contextmanager
def translate_errors(operation: str, name: str | None, timeout: float) -> Iterator[None]:
    """Turn redis errors and timeouts raised inside the block into `BackendError`."""
    try:
        yield
    except _Errors.with_timeout as exc:
        raise _backend_error(operation, name, timeout, exc) from exc


def outcome_unknown(error: BaseException) -> bool:
    """Whether a failed call may still have been applied by the server.

    A refused command (ACL, OOM, READONLY, a script error, TRYAGAIN while a cluster slot
    migrates) was not applied; a timeout or a broken connection may have been.
    """
    cause = error.__cause__ if isinstance(error, BackendError) else error
    return not (isinstance(cause, _Errors.response) or _migrating_refusal(cause))


def _migrating_refusal(error: BaseException | None) -> bool:
    """Whether a cluster refused a command because its slot is migrating: TRYAGAIN (a
    command naming several keys, some moved and some not, or missing), or redis-py's
    cluster client giving up after its own few tries of one ("TTL exhausted": every try
    was refused or redirected, so none was applied)."""
    if isinstance(error, _Errors.try_again):
        return True
    return isinstance(error, _Errors.cluster_failure) and "TTL exhausted" in str(error)


_DURING_MIGRATION: weakref.WeakSet[BaseException] = weakref.WeakSet()
"""Errors of calls that failed while a cluster slot they needed was migrating (a refusal
met, redirections that closed the cluster client's connections, a try still unanswered
at the bound): whether they were applied is in their cause, as for any error."""


def migrating(error: BaseException) -> bool:
    """Whether `error` (a `BackendError`) comes from a cluster slot's migration that
    outlasted the call's bound: the same call goes through once the migration ends. It was
    not applied if `outcome_unknown(error)` is false."""
    return isinstance(error, BackendError) and (
        error in _DURING_MIGRATION or _migrating_refusal(error.__cause__)
    )


def _sends_directly(client: redis.asyncio.Redis, library: ClientLibrary) -> bool:
    """Whether aiolock may send its scripts on `client`'s connections itself.

    A script call through `execute_command` packs its arguments in Python and goes through
    redis-py's retry and instrumentation layers, which aiolock replaces with its own
    bounds; sending on a pooled connection directly, packed by hiredis, costs a fraction.
    Only the library's own connection classes with the default UTF-8 encoding qualify: any
    other connection (fakeredis, Sentinel-managed, a subclass), encoding, or a client
    bound to a single connection goes through `execute_command`.
    """
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    return (
        hiredis is not None
        and not client.single_connection_client
        and pool.connection_class in library.direct
        and str(kwargs.get("encoding", "utf-8")).lower().replace("_", "-") in ("utf-8", "utf8")
        and kwargs.get("encoding_errors", "strict") == "strict"
    )


async def _pooled(pool: Any, command: str) -> Any:
    """A connection of `pool` (named by the command, for the pools that want that)."""
    if _names_connections(pool):
        return await pool.get_connection(command)
    return await pool.get_connection()


def _names_connections(pool: Any) -> bool:
    if isinstance(pool, redis.asyncio.ConnectionPool):
        return REDIS.names_connections
    return any(isinstance(pool, lib.connection_pool) and lib.names_connections for lib in _VALKEY)


_Command = tuple[str | int, ...]

_Call = tuple[Sequence[str], Sequence[str | int]]
"""One script call's KEYS and ARGV."""


_Sent = Callable[[], None] | None
"""Called once the command has been written (on the direct and Sentinel paths; through
`execute_command`, just before redis-py is handed it)."""


_DRAIN_ABOVE: Final = 65536
"""Bytes buffered in a connection's transport above which a write waits for them to drain."""


async def _write(connection: redis.asyncio.connection.AbstractConnection, packed: bytes) -> None:
    """Write `packed` on `connection` as its `send_packed_command` would, without the task
    redis-py's socket timeout wraps around every write on Python 3.11 (`asyncio.wait_for`):
    aiolock bounds the whole call itself. A connection that checks its health before
    writes (`health_check_interval`), or without a stream writer, goes redis-py's way.

    On any error the connection is closed, as redis-py closes it."""
    writer: asyncio.StreamWriter | None = getattr(connection, "_writer", None)
    if writer is None or getattr(connection, "health_check_interval", None):
        await connection.send_packed_command(packed)
        return
    try:
        writer.write(packed)
        if writer.transport.get_write_buffer_size() > _DRAIN_ABOVE:
            await writer.drain()
    except OSError as exc:
        await connection.disconnect(nowait=True)
        raise redis.exceptions.ConnectionError(f"error while writing to the socket: {exc}") from exc
    except BaseException:
        await connection.disconnect(nowait=True)
        raise


_NO_READ_TIMEOUT: Final = 1e9
"""The read timeout aiolock's calls pass to a connection whose client has a socket timeout:
none that matters (every call is bounded as a whole by aiolock). A socket timeout shorter
than an event-loop stall would fire as the loop resumes, before the reply that arrived
during the stall is read, and drop it (a renewal Redis confirmed, counted as missing). A
finite number: some event loops cannot schedule a timer at infinity."""


def _reader(
    connection: redis.asyncio.connection.AbstractConnection,
) -> Callable[[], Awaitable[Any]]:
    """How to read a reply on `connection`: without its client's socket timeout."""
    if getattr(connection, "socket_timeout", None) is None:
        return connection.read_response
    return functools.partial(connection.read_response, timeout=_NO_READ_TIMEOUT)


async def _read_pair(
    connection: redis.asyncio.connection.AbstractConnection, read: Callable[[], Awaitable[Any]]
) -> tuple[Any, Any]:
    """The replies to a command and the `WAIT` sent right after it on `connection` (read by
    `read`, see `_reader`). The
    second is read even when the first is an error reply, so that no reply is left unread
    on a connection that goes back to its pool; except after NOSCRIPT: that WAIT waits for
    nothing (the script did not run) and would answer only at its timeout, leaving too
    little of the call's bound for the EVAL and its own WAIT. The connection is closed
    instead, its reply unread."""
    try:
        first = await read()
    except _Errors.noscript:
        await connection.disconnect(nowait=True)
        raise
    except _Errors.response as exc:
        await read()
        raise exc from None
    return first, await read()


async def _send_direct(
    client: redis.asyncio.Redis, command: _Command, on_sent: _Sent, then: _Command | None = None
) -> Any:
    """One command on a connection of `client`'s pool: packed by hiredis, sent, answered.
    With `then` (a `WAIT`), both are written at once and both replies returned.

    On any error or cancellation while sending or reading, redis-py's connection closes
    itself, so a half-read reply never goes back to the pool.
    """
    pool = client.connection_pool
    connection = await _pooled(pool, str(command[0]))
    try:
        packed: bytes = hiredis.pack_command(command)  # type: ignore[arg-type]
        if then is not None:
            packed += hiredis.pack_command(then)  # type: ignore[arg-type]
        await _write(connection, packed)
        if on_sent is not None:
            on_sent()
        read = _reader(connection)
        if then is not None:
            return await _read_pair(connection, read)
        return await read()
    except (RuntimeError, AttributeError, TypeError) as exc:
        if not _closed_transport(exc):
            raise
        raise redis.exceptions.ConnectionError(f"the connection was closed: {exc!r}") from exc
    finally:
        await pool.release(connection)


MIGRATION_GRACE: Final = 1.0
"""Longest a call whose cluster slot migrates may outlast its bound, to let the try in
flight end (redis-py's cluster client tries a refused command a few times, for about
half a second, before it reports it): its outcome is then known, refused or applied."""

OWN_REDIRECTIONS: Final = 2
"""Tries aiolock's own cluster client makes of one command before it reports it (redis-py's
default: 16), enough to follow one MOVED or ASK. A migrating slot's refusal (TRYAGAIN) is
then waited out by aiolock, with backoff; redis-py's own quick tries would go on to the
importing node without ASKING, meet MOVED replies, and close every connection of the
client to find the nodes again, other calls' included."""

OWN_IDLE: Final = 2.0
"""Seconds aiolock's own cluster client stays open after its last call, once no lease needs
renewing."""

MIGRATION_MEMORY: Final = 5.0
"""Seconds after a cluster client last met a migrating slot during which a call's failure is
taken for a consequence of the migration."""

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
    except _Errors.with_timeout as exc:
        logger.debug("aiolock: no Sentinel named the master, using the connection: %s", exc)
        return None
    return address


async def _send_to_master(
    client: redis.asyncio.Redis, command: _Command, on_sent: _Sent, then: _Command | None = None
) -> Any:
    """One command on a connection of a Sentinel-managed pool (the user's, or aiolock's
    own), which must reach the master the Sentinels name now.

    A pooled connection stays open to the server it was opened to; after a failover that
    is a former master, which keeps its role (and takes writes) until the Sentinels demote
    it, about ten seconds later. Such a connection is closed and opened again, to the new
    master. When no Sentinel answers, the connection is used as it is (as redis-py would).
    A former master that was demoted already refuses writes with READONLY: redis-py's
    connection then closes itself and raises `ConnectionError`, and `_call` sends again.
    """
    pool: Any = client.connection_pool  # a Sentinel-managed pool, of either library
    address = await _master_address(pool)
    connection = await _pooled(pool, str(command[0]))
    try:
        if address is not None and (connection.host, connection.port) != tuple(address):
            # Opened again here, through the pool, which asks the Sentinels: a send on a
            # closed connection would reopen it to the address it had (redis-py 8 does).
            await connection.disconnect()
            await connection.connect()
        packed = connection.pack_command(*command)
        if then is not None:
            packed += connection.pack_command(*then)
        await connection.send_packed_command(packed)
        if on_sent is not None:
            on_sent()
        read = _reader(connection)
        if then is not None:
            return await _read_pair(connection, read)
        return await read()
    except (RuntimeError, AttributeError, TypeError) as exc:
        if not _closed_transport(exc):
            raise
        raise redis.exceptions.ConnectionError(f"the connection was closed: {exc!r}") from exc
    finally:
        await pool.release(connection)


async def _execute(
    client: Client, command: _Command, on_sent: _Sent, then: _Command | None = None
) -> Any:
    # Called before redis-py is handed the command: when it is written is not known here
    # (see `Backend.sees_writes`).
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
        if not _closed_transport(exc):
            raise
        raise redis.exceptions.ConnectionError(f"the connection was closed: {exc!r}") from exc


_CLUSTER_SETTINGS: Final = frozenset(inspect.signature(RedisCluster.__init__).parameters)
"""What a `RedisCluster` takes: of a user's cluster client's connection settings, those
that aiolock's own cluster client is made with."""

_NOT_COPIED: Final = frozenset(
    {"self", "host", "port", "startup_nodes", "max_connections", "retry", "read_from_replicas"}
)
"""Settings of the user's cluster client that aiolock's own does not take: it is made with
the nodes the user's client knows, without the user's pool limit or retries (its calls are
bounded by aiolock), and reads from primaries only."""


def _some_node(client: RedisCluster) -> ClusterNode:
    """A node of the cluster, to copy connection settings from (known before the client
    first asked the cluster for its nodes: one it was created with)."""
    node: ClusterNode | None = client.get_default_node()
    if node is None:  # not yet asked the cluster for its nodes
        node = next(iter(client.nodes_manager.startup_nodes.values()))
    return node


def _node_for(client: RedisCluster, key: str | None, avoid: str | None = None) -> ClusterNode:
    """The primary serving `key`'s slot as the client knows it, or a random primary (other
    than the one named `avoid`, if there is another)."""
    if key is not None:
        with contextlib.suppress(*_Errors.cluster, LookupError):
            node = client.get_node_from_key(key)
            if node is not None:
                return node
    primaries = client.get_primaries()
    others = [node for node in primaries if node.name != avoid]
    return random.choice(others or primaries) if primaries else _some_node(client)


def _closed_transport(error: Exception) -> bool:
    """Whether the event loop refused a write on a connection the other end had reset: a
    broken connection, retried on a new one like any other. asyncio's own loop normally lets
    such a write through and the read reports the reset; uvloop raises RuntimeError ("the
    handler is closed"), and the selector transport of CPython 3.12 and 3.13 before its fix
    for gh-136234 raises AttributeError or TypeError from `writelines()`. A redis-py
    connection closed by another task while a command was being written on it (its stream
    writer let go of) raises AttributeError from redis-py's own connection module."""
    if isinstance(error, RuntimeError):
        return "handler is closed" in str(error)
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    module = tb.tb_frame.f_globals.get("__name__")
    if module == "asyncio.selector_events":
        return True
    return (
        module in _Errors.connection_modules
        and isinstance(error, AttributeError)
        and "'NoneType' object" in str(error)
    )


_Send = Callable[[Any, _Command, _Sent, _Command | None], Awaitable[Any]]
"""Sends one command (and a second, `then`) on a client: a `redis.asyncio.Redis` for
`_send_direct` and `_send_to_master`, any client for `_execute`."""


class Backend:
    """How aiolock talks to one redis client: script calls on its pool, and connections of
    aiolock's own with its settings.

    One per client and event loop, held by that pair's `_runtime.Runtime`. The client itself
    is held weakly: locks hold it strongly, so it lives as long as they do.
    """

    @staticmethod
    def broken(error: BaseException) -> bool:
        """Whether `error` says that a connection broke or the server refused a command,
        including the event loop's own errors for a write on a connection that was reset
        (see `_closed_transport`)."""
        if isinstance(error, _Errors.any):
            return True
        return isinstance(error, RuntimeError | AttributeError | TypeError) and _closed_transport(
            error
        )

    __slots__ = (
        "__weakref__",
        "_client_ref",
        "_cluster",
        "_connection_class",
        "_connection_kwargs",
        "_library",
        "_migration_seen",
        "_own_calls",
        "_own_closer",
        "_own_pinned",
        "_own_used",
        "_pubsub_node",
        "_renew_client",
        "_renew_cluster",
        "_send",
        "_sentinel",
        "loop",
    )

    def __init__(self, client: AsyncClient) -> None:
        library = library_of(client)
        if library is None:  # pragma: no cover - the primitives check their client first
            _not_a_client(client)
        self._library = library
        # Typed as redis-py's: valkey-py's clients have the same API.
        client = cast(redis.asyncio.Redis | RedisCluster, client)
        self._client_ref: weakref.ref[redis.asyncio.Redis | RedisCluster] = weakref.ref(client)
        self.loop = asyncio.get_running_loop()
        self._renew_client: redis.asyncio.Redis | None = None
        self._renew_cluster: RedisCluster | None = None
        self._migration_seen = -math.inf  # when a call last met a migrating cluster slot
        # aiolock's own cluster client: calls in flight on it, when it was last used,
        # whether leases need it (renewals), and the task that closes it once idle.
        self._own_calls = 0
        self._own_used = -math.inf
        self._own_pinned = False
        self._own_closer: asyncio.Task[None] | None = None
        self._sentinel: SentinelConnectionPool | None = None
        self._send: _Send
        self._cluster = isinstance(client, library.cluster)
        self._pubsub_node: str | None = None
        self._connection_class: type[redis.asyncio.connection.AbstractConnection]
        if isinstance(client, library.cluster):
            # Script calls go through the cluster client, which routes each by its keys'
            # slot and follows MOVED and ASK; the pub/sub connection is aiolock's own, to
            # one primary (a PUBLISH reaches every node of a cluster).
            node = _some_node(client)
            self._connection_class = node.connection_class
            self._connection_kwargs = {
                k: v for k, v in node.connection_kwargs.items() if k not in ("host", "port")
            }
            self._connection_kwargs["retry"] = library.no_retry()
            self._send = _execute
            return
        assert isinstance(client, library.client)
        # aiolock's own connections use the client's settings; kept here so that a
        # lingering background task never needs the (weakly held) client itself.
        pool = client.connection_pool
        self._connection_class = pool.connection_class
        self._connection_kwargs = dict(pool.connection_kwargs)
        self._connection_kwargs["retry"] = library.no_retry()
        # A Sentinel-managed pool's connections find the master through the pool that made
        # them: aiolock's own pools are Sentinel-managed pools of the same service.
        if isinstance(pool, library.sentinel_pool):
            self._sentinel = pool
            self._connection_kwargs.pop("connection_pool", None)
        # aiolock's own connections are of the same class, with the same encoding. With
        # Sentinel, every call (on the user's pool and on aiolock's own) must reach the
        # master the Sentinels name now.
        if self._sentinel is not None and self._sentinel.is_master:
            self._send = _send_to_master
        else:
            self._send = _send_direct if _sends_directly(client, library) else _execute

    @property
    def sees_writes(self) -> bool:
        """Whether a call's `on_sent` is called once its command was written (aiolock
        sends it on a connection itself), rather than when redis-py is handed it
        (`execute_command`: a cluster, fakeredis, a connection class of another kind)."""
        return self._send is not _execute

    @property
    def cluster(self) -> bool:
        """Whether the client is a `RedisCluster`: a script call's keys must then share
        one slot (renewals are sent one call per slot)."""
        return self._cluster

    @staticmethod
    def slot(key: str) -> int:
        """The cluster hash slot of `key`."""
        return int(key_slot(key.encode("utf-8", "surrogateescape")))

    @property
    def library(self) -> ClientLibrary:
        """The client's library: redis-py, or valkey-py."""
        return self._library

    @property
    def client(self) -> redis.asyncio.Redis | RedisCluster:
        client = self._client_ref()
        if client is None:  # pragma: no cover - locks keep their client alive
            raise RuntimeError("the redis client of this lock was garbage-collected")
        return client

    @property
    def sentinel(self) -> bool:
        """Whether the client is a Sentinel-managed one (`Sentinel.master_for`)."""
        return self._sentinel is not None

    async def master_moved(self, pubsub: PubSub) -> bool:
        """Whether `pubsub`'s connection is open to a server that the Sentinels no longer
        name as the master (False for a client without Sentinel, or if no Sentinel answered
        in time)."""
        # redis-py types `PubSub.connection` as always None.
        connection: redis.asyncio.Connection | None = getattr(pubsub, "connection", None)
        pool = pubsub.connection_pool
        if (
            connection is None
            or not isinstance(pool, self._library.sentinel_pool)
            or not pool.is_master
        ):
            return False
        address = await _master_address(pool)
        return address is not None and (connection.host, connection.port) != tuple(address)

    @property
    def health_interval(self) -> float:
        """The client's redis-py `health_check_interval` (seconds; 0 if unset)."""
        return float(self._connection_kwargs.get("health_check_interval") or 0)

    async def run(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[str | int],
        *,
        timeout: float,
        operation: str,
        name: str | None,
        background: bool = False,
        fresh: bool = False,
        on_sent: _Sent = None,
        wait: tuple[int, int] | None = None,
        by_text: bool = False,
    ) -> Any:
        """Run one script in one round trip (two the first time a server sees it, unless
        `by_text`: sent as EVAL with its text, which runs even on a server that does not
        know it yet, for a call that must be applied in one send).

        User-initiated calls go through the user's client; `background` calls (renewals)
        through aiolock's own connections, which are never busy with the user's commands;
        `fresh` calls on a connection of their own, closed after (the user's connections
        may belong to another event loop). The whole call, retries included, is bounded
        by `timeout`. `on_sent` is called when the command has been written (possibly
        twice, if it is sent again).

        With a cluster client, `fresh` calls go on a connection of their own to the node
        that serves the first key's slot.

        `wait=(replicas, ms)` sends `WAIT replicas ms` right after the script, on the same
        connection and in the same round trip (WAIT cannot run inside a script), and
        returns `(the script's reply, how many replicas acknowledged its writes)`. `ms`
        must be at least 1 (`WAIT` with 0 would block for ever) and well within `timeout`.
        """
        command: _Command = (
            ("EVAL", script.source, len(keys), *keys, *args)
            if by_text
            else ("EVALSHA", script.sha, len(keys), *keys, *args)
        )
        then: _Command | None = None
        if wait is not None:
            replicas, wait_ms = wait
            assert wait_ms >= 1, "WAIT 0 blocks for ever"
            then = ("WAIT", replicas, wait_ms)
        if fresh:
            client = self._library.client(
                connection_pool=self._connection_pool(keys[0] if keys else None)
            )
            try:
                return await self._call(
                    client,
                    command,
                    script=script,
                    timeout=timeout,
                    operation=operation,
                    name=name,
                    on_sent=on_sent,
                    then=then,
                )
            finally:
                await client.connection_pool.disconnect()
        if self._cluster:
            # Every script call goes through aiolock's own cluster client (see `_own_cluster`).
            async with self._own_cluster_in_use(pin=background) as own:
                return await self._call(
                    own,
                    command,
                    script=script,
                    timeout=timeout,
                    operation=operation,
                    name=name,
                    on_sent=on_sent,
                    then=then,
                )
        target = self._background_client() if background else self.client
        reply = await self._call(
            target,
            command,
            script=script,
            timeout=timeout,
            operation=operation,
            name=name,
            on_sent=on_sent,
            then=then,
        )
        if then is not None:
            return reply[0], int(reply[1])
        return reply

    async def run_each(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[str], Sequence[str | int]]],
        *,
        timeout: float,
        operation: str,
        split: Callable[[Sequence[str], Sequence[str | int]], list[_Call]] | None = None,
    ) -> list[Any]:
        """Several calls of one script on a cluster, each with its own keys (of one slot),
        in one round trip per node (redis-py's cluster pipeline) on aiolock's own cluster
        client, bounded by `timeout` as a whole; their replies, in order.

        A call the pipeline could not complete (a node that does not know the script, a
        MOVED or ASK that the pipeline of older redis-py versions does not follow, a broken
        connection to a node that failed) is sent again on its own, concurrently with the
        others, through the cluster client, which follows redirections and finds a failed
        node's successor. Every script is safe to apply twice. A call of several keys that
        its slot's migration refuses (TRYAGAIN: some of them moved, some not) is sent as
        the calls `split` makes of it, one key each (which the migration redirects, never
        refuses), their replies put together, if `split` is given.
        """
        async with self._own_cluster_in_use(pin=True) as client:
            return await self._run_each(
                client, script, calls, timeout=timeout, operation=operation, split=split
            )

    async def _run_each(
        self,
        client: RedisCluster,
        script: Script,
        calls: Sequence[tuple[Sequence[str], Sequence[str | int]]],
        *,
        timeout: float,
        operation: str,
        split: Callable[[Sequence[str], Sequence[str | int]], list[_Call]] | None,
    ) -> list[Any]:
        commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls]

        async def pipelined() -> list[Any]:
            pipe = client.pipeline()
            for command in commands:
                pipe.execute_command(*command)
            try:
                replies: list[Any] = await pipe.execute(raise_on_error=False)
            except (*_Errors.connection, *_Errors.timeout) as exc:
                return [exc] * len(commands)
            return replies

        async def alone(index: int, failed: BaseException) -> Any:
            command = commands[index]
            if isinstance(failed, _Errors.noscript):
                command = ("EVAL", script.source, *command[2:])
            try:
                return await self._send_once(client, command, script, None, None)
            except (*_Errors.try_again, *_Errors.cluster_failure) as exc:
                keys, args = calls[index]
                if split is None or len(keys) < 2 or not _migrating_refusal(exc):
                    raise
            pieces = split(keys, args)
            answers = await asyncio.gather(
                *(
                    self._send_once(
                        client, ("EVALSHA", script.sha, len(k), *k, *a), script, None, None
                    )
                    for k, a in pieces
                )
            )
            return [reply for answer in answers for reply in answer]

        async def send() -> list[Any]:
            replies = await pipelined()
            again = [i for i, reply in enumerate(replies) if isinstance(reply, BaseException)]
            if again:
                answers = await asyncio.gather(*(alone(i, replies[i]) for i in again))
                for i, answer in zip(again, answers, strict=True):
                    replies[i] = answer
            return replies

        result: list[Any] = await self._call(
            client, (), script=script, timeout=timeout, operation=operation, name=None, send=send
        )
        return result

    @contextlib.asynccontextmanager
    async def node_client(self, key: str) -> AsyncIterator[redis.asyncio.Redis]:
        """A client of the one server holding `key`: the user's client, or for a cluster, a
        client of its own to the node serving `key`'s slot, closed on exit (to read a
        primitive's keys in one MULTI/EXEC with the server's TIME)."""
        async with self._clients_of(lambda cluster: [_node_for(cluster, key)]) as (client,):
            yield client

    @contextlib.asynccontextmanager
    async def primary_clients(self) -> AsyncIterator[list[redis.asyncio.Redis]]:
        """A client of each primary: the user's client alone, or for a cluster one client
        of aiolock's own per primary (to scan every node), closed on exit."""
        async with self._clients_of(lambda cluster: cluster.get_primaries()) as clients:
            yield clients

    @contextlib.asynccontextmanager
    async def _clients_of(
        self, nodes: Callable[[RedisCluster], list[ClusterNode]]
    ) -> AsyncIterator[list[redis.asyncio.Redis]]:
        """The user's client alone; for a cluster, a client of aiolock's own to each of
        `nodes(cluster)` (asked once the cluster client knows which node serves which
        slot), closed on exit."""
        client = self.client
        if not isinstance(client, self._library.cluster):
            assert isinstance(client, self._library.client)
            yield [client]
            return
        await client.initialize()  # nothing is sent if it knows its nodes already
        own = [
            self._library.client(connection_pool=self._node_pool(node)) for node in nodes(client)
        ]
        try:
            yield own
        finally:
            for one in own:
                await one.connection_pool.disconnect()

    async def exists(self, key: str, *, timeout: float, name: str) -> bool:
        reply = await self._call(
            self.client,
            ("EXISTS", key),
            script=None,
            timeout=timeout,
            operation="inspect",
            name=name,
        )
        return bool(reply)

    async def _call(
        self,
        client: Client,
        command: _Command,
        *,
        script: Script | None,
        timeout: float,
        operation: str,
        name: str | None,
        on_sent: _Sent = None,
        then: _Command | None = None,
        send: Callable[[], Awaitable[Any]] | None = None,
    ) -> Any:
        """Send `command` (an EVALSHA of `script`, sent by EVAL if the server does not know
        it), and `then` right after it if given, bounded by `timeout`, with its errors
        translated. `send`, if given, sends instead (and `command` is not sent).

        When the timeout falls due, the event loop first reads whatever has arrived (the
        loop may have been blocked while the reply came): a reply already there is used.

        A broken connection (a pooled connection the server closed, after a restart for
        example) is retried once at once on a new one: every script is safe to apply twice.

        Cancellation:
            A cancellation that arrives while the reply is being read propagates. On Python
            3.11, redis-py's socket timeout (`asyncio.wait_for`) can swallow a cancellation
            that lands just as a send completes; it is detected here by the task's cancel
            count and re-raised, so a cancelled acquire never turns into a granted lease.
        """
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - asyncio always runs coroutines in a task
            raise RuntimeError("aiolock must be used from an asyncio task")
        cancelling = task.cancelling()
        expired = False
        answered = False
        # While a migrating cluster slot refuses the call, it is sent again after pauses.
        # The bound then ends it between two tries (every one refused: nothing applied), or
        # lets the try in flight end first (redis-py's own few tries, each refused or
        # answered), for at most MIGRATION_GRACE.
        backoff: Backoff | None = None
        waiting_out = False  # a refusal of a migrating slot was met
        refused: BaseException | None = None  # set while pausing after such a refusal
        overdue = False  # the bound passed while a try of a migration waited out was sent
        grace: asyncio.TimerHandle | None = None

        def give_up() -> None:
            nonlocal expired, overdue, grace
            if answered:
                return
            if waiting_out and refused is None and not overdue:
                overdue = True
                grace = self.loop.call_later(MIGRATION_GRACE, after_arrivals, self.loop, give_up)
                return
            expired = True
            task.cancel()

        # What asyncio.timeout does, for a fraction of its cost on this hot path.
        timer = self.loop.call_later(timeout, after_arrivals, self.loop, give_up)
        try:
            retried = False
            while True:
                try:
                    if send is not None:
                        result = await send()
                    else:
                        result = await self._send_once(client, command, script, on_sent, then)
                    break
                except _Errors.connection:
                    if (retried and not self._cluster) or overdue:
                        raise
                    # Sent again on a new connection (every script is safe to apply twice):
                    # once, at once; on a cluster, as often as it takes within the bound,
                    # after a pause (a failover, or redis-py's cluster client closing every
                    # connection of a client that met many redirections while a slot
                    # migrates, other calls' included).
                    if retried:
                        backoff = backoff or Backoff(base=0.02, cap=0.25, rng=random.Random())
                        await asyncio.sleep(backoff.next())
                    retried = True
                except (*_Errors.try_again, *_Errors.cluster_failure) as exc:
                    if not (self._cluster and _migrating_refusal(exc)):
                        raise
                    # The slot migrates, a name's keys on both sides: nothing was applied,
                    # and it will be once the migration ends. Wait within the bound.
                    self._migration_seen = self.loop.time()
                    if overdue:
                        raise _backend_error(operation, name, timeout, exc) from exc
                    waiting_out = True
                    refused = exc
                    backoff = backoff or Backoff(base=0.02, cap=0.25, rng=random.Random())
                    await asyncio.sleep(backoff.next())
                    refused = None
            answered = True
        except asyncio.CancelledError as exc:
            if expired and task.uncancel() <= cancelling:
                if refused is not None:
                    # Out of time between two tries, every one refused: not applied.
                    raise _backend_error(operation, name, timeout, refused) from refused
                raise self._failed(operation, name, timeout, TimeoutError(), waiting_out) from exc
            raise
        except _Errors.any as exc:
            if expired:
                task.uncancel()  # our timer's cancellation, turned into this error on the way
                raise self._failed(operation, name, timeout, TimeoutError(), waiting_out) from exc
            if task.cancelling() > cancelling:
                # The caller's cancellation, swallowed on the way (redis-py's wait_for on
                # Python 3.11) and turned into this error: it must not be lost.
                raise asyncio.CancelledError from exc
            raise self._failed(operation, name, timeout, exc, waiting_out) from exc
        finally:
            answered = True
            timer.cancel()
            if grace is not None:
                grace.cancel()
        if expired:
            task.uncancel()  # our timer's cancellation, swallowed: the answer came anyway
        if task.cancelling() > cancelling:
            raise asyncio.CancelledError
        return result

    def _failed(
        self,
        operation: str,
        name: str | None,
        timeout: float,
        error: BaseException,
        waiting_out: bool,
    ) -> BackendError:
        """The `BackendError` for a call that failed with `error`; one that met a migrating
        slot, or failed while a slot of this cluster was migrating (its redirections make
        redis-py's cluster client close its connections, and find the nodes again), is
        marked as such (see `migrating`)."""
        failed = _backend_error(operation, name, timeout, error)
        if self._cluster and (
            waiting_out or self.loop.time() - self._migration_seen < MIGRATION_MEMORY
        ):
            _DURING_MIGRATION.add(failed)
        return failed

    async def _send_once(
        self,
        client: Client,
        command: _Command,
        script: Script | None,
        on_sent: _Sent,
        then: _Command | None,
    ) -> Any:
        """Send `command` (and `then`); an EVALSHA the server does not know (flushed, or
        lost in a restart) is sent again as EVAL, which also caches the script."""
        try:
            return await self._send(client, command, on_sent, then)
        except _Errors.noscript as exc:
            if script is None:
                raise
            # Drop its traceback: redis-py's frame in it holds the error (a cycle only the
            # cycle collector frees), and from Python 3.12 on its frames keep their callers
            # alive, with the lease an acquire returned.
            exc.__traceback__ = None
            source = script.source
        # Sent once the error is no longer being handled: a client that keeps the exception
        # being handled (fakeredis's Lua bridge does on Python 3.12+) would keep it forever.
        return await self._send(client, ("EVAL", source, *command[2:]), on_sent, then)

    @staticmethod
    def refused(error: BaseException) -> bool:
        """Whether the server answered with an error (ACL, OOM, READONLY...), as opposed to
        a connection that broke or did not answer."""
        return not outcome_unknown(error)

    def _connection_pool(self, key: str | None = None) -> redis.asyncio.ConnectionPool:
        """A new pool with the user's connection settings and no retries of its own; for a
        Sentinel-managed client, a Sentinel-managed pool of the same service and Sentinels,
        which finds the master for itself; for a cluster client, a pool of the primary that
        serves `key` (a random primary without one)."""
        if self._cluster:
            client = self.client
            assert isinstance(client, self._library.cluster)
            return self._node_pool(_node_for(client, key))
        sentinel = self._sentinel
        if sentinel is not None:
            return self._library.sentinel_pool(
                sentinel.service_name,
                sentinel.sentinel_manager,
                is_master=sentinel.is_master,
                check_connection=sentinel.check_connection,
                connection_class=self._connection_class,
                **self._connection_kwargs,
            )
        return self._library.connection_pool(
            connection_class=self._connection_class, **self._connection_kwargs
        )

    def _node_pool(self, node: ClusterNode) -> redis.asyncio.ConnectionPool:
        """A new pool of connections to one cluster node, with the user's settings."""
        return self._library.connection_pool(
            connection_class=self._connection_class,
            host=node.host,
            port=node.port,
            **self._connection_kwargs,
        )

    def _background_client(self) -> Client:
        if self._renew_client is None:
            self._renew_client = self._library.client(connection_pool=self._connection_pool())
        return self._renew_client

    @contextlib.asynccontextmanager
    async def _own_cluster_in_use(self, *, pin: bool) -> AsyncIterator[RedisCluster]:
        """aiolock's own cluster client, made if need be, for one call; kept open while
        calls use it, while leases need renewing (`pin`: a renewal's call), and for
        OWN_IDLE seconds after the last call, then closed by a task of its own (which the
        event loop's shutdown also ends, closing it)."""
        if self._renew_cluster is None:
            self._renew_cluster = self._own_cluster()
        if self._own_closer is None:
            self._own_closer = self.loop.create_task(
                self._close_own_cluster_when_idle(), name="aiolock-cluster-client"
            )
        if pin:
            self._own_pinned = True
        self._own_calls += 1
        try:
            yield self._renew_cluster
        finally:
            self._own_calls -= 1
            self._own_used = self.loop.time()

    async def _close_own_cluster_when_idle(self) -> None:
        try:
            while True:
                await asyncio.sleep(OWN_IDLE)
                idle = self.loop.time() - self._own_used >= OWN_IDLE
                if not self._own_pinned and self._own_calls == 0 and idle:
                    return
        finally:
            own, self._renew_cluster = self._renew_cluster, None
            self._own_closer = None
            if own is not None:
                await own.aclose()

    def _own_cluster(self) -> RedisCluster:
        """A cluster client of aiolock's own, for every script call on a cluster: the
        user's connection settings (those a `RedisCluster` takes), connections of its own
        (the user's pool limit is not its own, and a pool exhausted by the user's commands
        does not hold renewals up), and the nodes the user's client knows to start from.
        It routes by slot and follows redirections itself, OWN_REDIRECTIONS at a time."""
        user = self.client
        assert isinstance(user, self._library.cluster)
        settings = {
            key: value
            for key, value in self._connection_kwargs.items()
            if key in _CLUSTER_SETTINGS and key not in _NOT_COPIED
        }
        if issubclass(self._connection_class, self._library.ssl_connection):
            settings["ssl"] = True
        known = user.get_primaries() or list(user.nodes_manager.startup_nodes.values())
        manager = user.nodes_manager
        own = self._library.cluster(
            startup_nodes=[type(node)(node.host, node.port) for node in known],
            require_full_coverage=manager.require_full_coverage,
            address_remap=getattr(manager, "address_remap", None),
            **settings,
        )
        own.RedisClusterRequestTTL = OWN_REDIRECTIONS
        return own

    async def close_background_client(self) -> None:
        """Close the renewal connections; called when no lease needs renewing. (aiolock's
        own cluster client closes by itself once idle.)"""
        client, self._renew_client = self._renew_client, None
        if client is not None:
            await client.connection_pool.disconnect()
        self._own_pinned = False

    def new_pubsub(self) -> PubSub:
        """A pub/sub session on a connection of its own. On a cluster, to a primary other
        than the previous session's: a session is replaced when its node stopped answering,
        which the cluster client may not know yet."""
        if not self._cluster:
            return self._library.pubsub(connection_pool=self._connection_pool())
        client = self.client
        assert isinstance(client, self._library.cluster)
        node = _node_for(client, None, avoid=self._pubsub_node)
        self._pubsub_node = node.name
        return self._library.pubsub(connection_pool=self._node_pool(node))
