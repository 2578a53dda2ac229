"""The client libraries aiolock talks through: redis-py, or valkey-py (its fork).

A client's `ClientLibrary` gives the classes aiolock makes its own connections, pools and
pub/sub sessions of, and the errors it maps. valkey-py is imported only once a client of
it is given. The errors of every library in use are collected in `Errors`, and translated
here into `BackendError` (`backend_error`, `translate_errors`), with the questions the
rest of aiolock asks of a failure: was it applied (`outcome_unknown`), did a connection
break (`broken`), did a cluster slot's migration refuse it (`migrating`).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn, Protocol, cast

import redis
import redis.asyncio
import redis.exceptions
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.backoff import NoBackoff

from ..errors import BackendError
from .pubsub import PubSubSession

__all__ = (
    "DIRECT_CONNECTIONS",
    "DURING_MIGRATION",
    "PASSING_REFUSALS",
    "REDIS",
    "STALLED",
    "AsyncClient",
    "AsyncRedis",
    "Client",
    "ClientLibrary",
    "Errors",
    "ValkeyClient",
    "backend_error",
    "broken",
    "check_client",
    "closed_transport",
    "is_cluster",
    "lasting",
    "library_of",
    "mark_stalled",
    "migrating",
    "migrating_refusal",
    "not_a_client",
    "outcome_unknown",
    "stalled_for",
    "translate_errors",
    "valkey_libraries",
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
    """The module of its asyncio connections (see `closed_transport`)."""
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
    redirect_errors: tuple[type[Exception], ...]
    """A cluster node's answers that a command was not applied and belongs elsewhere or
    later: MOVED, ASK (a slot that moved or migrates), CLUSTERDOWN."""
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
    pubsub=PubSubSession,
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
    redirect_errors=(redis.exceptions.AskError, redis.exceptions.ClusterDownError),
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
        redirect_errors=(valkey.exceptions.AskError, valkey.exceptions.ClusterDownError),
        ssl_connection=connections.SSLConnection,
        advice="valkey.asyncio.Valkey(...), valkey.asyncio.from_url(...) or "
        "valkey.asyncio.ValkeyCluster(...)",
    )


class Errors:
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
    redirected: tuple[type[BaseException], ...] = REDIS.redirect_errors
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
        cls.redirected += library.redirect_errors
        cls.connection_modules += (library.connection_module,)


_VALKEY: list[ClientLibrary] = []
"""valkey-py's `ClientLibrary`, once a client of it was given."""


def _valkey_library() -> ClientLibrary:
    if not _VALKEY:
        library = _load_valkey()
        Errors.add(library)
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
    return not_a_client(client)


def is_cluster(client: object) -> bool:
    """Whether `client` is a cluster client (`RedisCluster`, `ValkeyCluster`)."""
    library = library_of(client)
    return library is not None and isinstance(client, library.cluster)


def not_a_client(client: object) -> NoReturn:
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


def backend_error(
    operation: str, name: str | None, timeout: float, error: BaseException
) -> BackendError:
    """The `BackendError` for `error` (a redis error, an OSError, or our own timeout)."""
    what = f"{operation} of lock {name!r}" if name is not None else operation
    if isinstance(error, TimeoutError) and not isinstance(error, Errors.library):
        return BackendError(
            f"{what}: no reply from Redis within {timeout:.3g}s", operation=operation, name=name
        )
    return BackendError(f"{what} failed: {error}", operation=operation, name=name)


@contextmanager
def translate_errors(operation: str, name: str | None, timeout: float) -> Iterator[None]:
    """Turn redis errors and timeouts raised inside the block into `BackendError`."""
    try:
        yield
    except Errors.with_timeout as exc:
        raise backend_error(operation, name, timeout, exc) from exc


def outcome_unknown(error: BaseException) -> bool:
    """Whether a failed call may still have been applied by the server.

    A refused command (ACL, OOM, READONLY, a script error, TRYAGAIN while a cluster slot
    migrates) was not applied; a timeout or a broken connection may have been.
    """
    cause = error.__cause__ if isinstance(error, BackendError) else error
    return not (isinstance(cause, Errors.response) or migrating_refusal(cause))


PASSING_REFUSALS: Final = ("BUSY", "LOADING", "OOM", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")
"""Error replies that say the server cannot run the command now, not that it never will."""


def lasting(error: BaseException) -> bool:
    """Whether a failed call would fail the same way if sent again: the server refused the
    command for what it is (a wrong type, a permission, a script error), not for a passing
    state (busy, loading, out of memory); a timeout or a broken connection may pass."""
    cause = error.__cause__ if isinstance(error, BackendError) else error
    if not isinstance(cause, Errors.response) or migrating_refusal(cause):
        return False
    return not str(cause).startswith(PASSING_REFUSALS)


def migrating_refusal(error: BaseException | None) -> bool:
    """Whether a cluster refused a command because its slot is migrating: TRYAGAIN (a
    command naming several keys, some moved and some not, or missing), or redis-py's
    cluster client giving up after its own few tries of one ("TTL exhausted": every try
    was refused or redirected, so none was applied)."""
    if isinstance(error, Errors.try_again):
        return True
    return isinstance(error, Errors.cluster_failure) and "TTL exhausted" in str(error)


DURING_MIGRATION: weakref.WeakSet[BaseException] = weakref.WeakSet()
"""Errors of calls that failed while a cluster slot they needed was migrating (a refusal
met, redirections that closed the cluster client's connections, a try still unanswered
at the bound): whether they were applied is in their cause, as for any error."""


STALLED: weakref.WeakKeyDictionary[BaseException, float] = weakref.WeakKeyDictionary()
"""Errors of calls whose bound fell due while the event loop did not run (a blocking
call, a paused process), with how late it was noticed: the stall spent the call's time,
whatever Redis did."""


def stalled_for(error: BaseException) -> float | None:
    """How long a stall of this process spent the time of the call that failed with
    `error` (see `STALLED`), or None."""
    return STALLED.get(error)


def mark_stalled(failed: BaseException, errors: Collection[BaseException], tolerated: int) -> None:
    """Mark `failed`, a quorum's call that failed with `errors` on its nodes, as failed by
    a stall of this process if every error is (and more than the `tolerated` failures)."""
    stalls = [STALLED.get(error, 0.0) for error in errors]
    if len(stalls) > tolerated and min(stalls, default=0.0) > 0.0:
        STALLED[failed] = min(stalls)


def migrating(error: BaseException) -> bool:
    """Whether `error` (a `BackendError`) comes from a cluster slot's migration that
    outlasted the call's bound: the same call goes through once the migration ends. It was
    not applied if `outcome_unknown(error)` is false."""
    return isinstance(error, BackendError) and (
        error in DURING_MIGRATION or migrating_refusal(error.__cause__)
    )


def closed_transport(error: Exception) -> bool:
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
        module in Errors.connection_modules
        and isinstance(error, AttributeError)
        and "'NoneType' object" in str(error)
    )


def broken(error: BaseException) -> bool:
    """Whether `error` says that a connection broke or the server refused a command,
    including the event loop's own errors for a write on a connection that was reset
    (see `closed_transport`)."""
    if isinstance(error, Errors.any):
        return True
    return isinstance(error, RuntimeError | AttributeError | TypeError) and closed_transport(error)


def valkey_libraries() -> list[ClientLibrary]:
    """valkey-py's `ClientLibrary`, once a client of it was given (else none)."""
    return _VALKEY
