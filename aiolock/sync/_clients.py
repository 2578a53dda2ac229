"""A synchronous client's asyncio twin: the client aiolock's engine uses on the portal's loop.

The user gives a synchronous client (redis-py's `redis.Redis`, one made by
`redis.Sentinel(...).master_for(...)`, a `redis.RedisCluster`, or valkey-py's of the same
kinds) or a URL. The twin is made once per client and process, from its connection
settings (`SETTINGS`, those the asyncio connection class takes), with a pool of its own:
the same server, database, credentials, timeouts, encoding, protocol and TLS settings; not
the client's retry policy (aiolock bounds and sends again its own calls), its pool's
connections (sockets belong to one kind of client), a custom parser, client-side caching or
connect callbacks. A URL's twin is made with `from_url` and owned here: closed when the
portal stops.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import weakref
from types import ModuleType
from typing import Any, Final, Protocol, cast

import redis

from .._transport.clients import AsyncClient
from . import _portal

__all__ = ("SETTINGS", "SyncClient", "close_twins", "twin", "twins")


class SyncValkeyClient(Protocol):
    """valkey-py's synchronous clients (`valkey.Valkey`, `valkey.ValkeyCluster`), by their
    shape: aiolock's types need no valkey import. Which classes are taken is checked when
    the client is given (`twin`)."""

    def execute_command(self, *args: Any, **options: Any) -> Any: ...

    def close(self) -> None: ...


SyncClient = redis.Redis | redis.RedisCluster | SyncValkeyClient | str
"""A synchronous client of redis-py or valkey-py (`redis.Redis`, `redis.RedisCluster`, a
Sentinel's `master_for` client; `valkey.Valkey`, `valkey.ValkeyCluster`), or a URL: checked
when given (`twin`)."""

SETTINGS: Final = frozenset(
    {
        "host",
        "port",
        "path",
        "db",
        "username",
        "password",
        "credential_provider",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "client_name",
        "lib_name",
        "lib_version",
        "driver_info",
        "encoding",
        "encoding_errors",
        "decode_responses",
        "protocol",
        "health_check_interval",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_ca_path",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
        "ssl_password",
        "ssl_include_verify_flags",
        "ssl_exclude_verify_flags",
    }
)
"""The connection settings a twin is made with, where the asyncio class takes them."""

_twins: weakref.WeakKeyDictionary[Any, AsyncClient] = weakref.WeakKeyDictionary()
_by_url: dict[str, AsyncClient] = {}


def _library(client: object) -> ModuleType | None:
    """`redis` or `valkey`, if `client` is one of their synchronous clients."""
    roots = {klass.__module__.partition(".")[0] for klass in type(client).__mro__}
    for root in ("redis", "valkey"):
        if root in roots:
            module = importlib.import_module(root)
            single = module.Redis if root == "redis" else module.Valkey
            cluster = module.RedisCluster if root == "redis" else module.ValkeyCluster
            if isinstance(client, single | cluster):
                return module
    return None


def _refuse(client: object) -> TypeError:
    root = type(client).__module__.partition(".")[0]
    if root in ("redis", "valkey") and ".asyncio" in type(client).__module__:
        return TypeError(
            f"client must be a synchronous client, got the asyncio "
            f"{type(client).__module__}.{type(client).__name__}: use aiolock.Lock (and the "
            "other asyncio primitives) with it, or give aiolock.sync a synchronous client "
            f"({root}.{'Redis' if root == 'redis' else 'Valkey'}(...))"
        )
    return TypeError(
        "client must be a redis.Redis or RedisCluster (redis-py), a valkey.Valkey or "
        "ValkeyCluster (valkey-py), a Sentinel's master_for() client, or a URL "
        f"(redis://, rediss://, unix://), got {type(client).__name__}"
    )


def _settings(kwargs: dict[str, Any], target: type) -> dict[str, Any]:
    """The settings of `kwargs` that `target` (an asyncio connection or client class)
    takes."""
    accepted: set[str] = set()
    for klass in target.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            accepted |= set(inspect.signature(init).parameters)
    chosen = {k: v for k, v in kwargs.items() if k in SETTINGS and k in accepted}
    if not isinstance(chosen.get("socket_keepalive_options"), dict):
        chosen.pop("socket_keepalive_options", None)
    return chosen


def _connection_class(library: ModuleType, sync_class: type) -> type:
    """The asyncio connection class of the kind of `sync_class`."""
    connection = importlib.import_module(f"{library.__name__}.connection")
    asyncio_connection = importlib.import_module(f"{library.__name__}.asyncio.connection")
    for kind in ("SSLConnection", "UnixDomainSocketConnection", "Connection"):
        if issubclass(sync_class, getattr(connection, kind)):
            return cast(type, getattr(asyncio_connection, kind))
    raise TypeError(
        f"the client's connection class {sync_class.__name__} is not one of "
        f"{library.__name__}'s (Connection, SSLConnection, UnixDomainSocketConnection): "
        "aiolock.sync cannot make an asyncio client like it"
    )


def _single(library: ModuleType, client: Any) -> AsyncClient:
    """The twin of a client of one server (or of a Sentinel's master)."""
    aio = importlib.import_module(f"{library.__name__}.asyncio")
    pool = client.connection_pool
    sentinel_module = importlib.import_module(f"{library.__name__}.sentinel")
    if isinstance(pool, sentinel_module.SentinelConnectionPool):
        return _sentinel(library, pool)
    connection_class = _connection_class(library, pool.connection_class)
    settings = _settings(dict(pool.connection_kwargs), connection_class)
    async_pool = aio.ConnectionPool(
        connection_class=connection_class,
        max_connections=getattr(pool, "max_connections", None),
        **settings,
    )
    client_class = aio.Redis if library.__name__ == "redis" else aio.Valkey
    return cast(AsyncClient, client_class(connection_pool=async_pool))


def _sentinel(library: ModuleType, pool: Any) -> AsyncClient:
    """The twin of a `Sentinel(...).master_for()` (or `slave_for()`) client."""
    aio_sentinel = importlib.import_module(f"{library.__name__}.asyncio.sentinel")
    aio_connection = importlib.import_module(f"{library.__name__}.asyncio.connection")
    manager = pool.sentinel_manager
    sentinels = []
    for each in manager.sentinels:
        kwargs = each.connection_pool.connection_kwargs
        sentinels.append((kwargs["host"], kwargs["port"]))
    sentinel = aio_sentinel.Sentinel(
        sentinels,
        min_other_sentinels=manager.min_other_sentinels,
        sentinel_kwargs=_settings(dict(manager.sentinel_kwargs), aio_connection.Connection),
    )
    settings = _settings(dict(pool.connection_kwargs), aio_connection.Connection)
    settings.pop("host", None)
    settings.pop("port", None)
    made = sentinel.master_for if pool.is_master else sentinel.slave_for
    return cast(AsyncClient, made(pool.service_name, **settings))


def _cluster(library: ModuleType, client: Any) -> AsyncClient:
    """The twin of a cluster client: the nodes it knows, its connection settings."""
    aio_cluster = importlib.import_module(f"{library.__name__}.asyncio.cluster")
    cluster_class = (
        aio_cluster.RedisCluster if library.__name__ == "redis" else aio_cluster.ValkeyCluster
    )
    manager = client.nodes_manager
    settings = _settings(dict(getattr(manager, "connection_kwargs", {})), cluster_class)
    settings.pop("host", None)
    settings.pop("port", None)
    settings.pop("path", None)
    known = client.get_primaries() or list(manager.startup_nodes.values())
    startup = [aio_cluster.ClusterNode(node.host, node.port) for node in known]
    connection = importlib.import_module(f"{library.__name__}.connection")
    if issubclass(
        manager.connection_kwargs.get("connection_class", object), connection.SSLConnection
    ):
        settings["ssl"] = True
    return cast(
        AsyncClient,
        cluster_class(
            startup_nodes=startup,
            require_full_coverage=manager._require_full_coverage,
            address_remap=getattr(manager, "address_remap", None),
            **settings,
        ),
    )


def _from_url(url: str) -> AsyncClient:
    made = _by_url.get(url)
    if made is None:
        import redis.asyncio  # noqa: PLC0415 - the library aiolock depends on

        try:
            made = _by_url[url] = cast(AsyncClient, redis.asyncio.Redis.from_url(url))
        except ValueError as exc:
            from ..errors import ConfigError  # noqa: PLC0415

            raise ConfigError(
                f"client {url!r} is not a Redis URL (redis://, rediss://, unix://): {exc}",
                argument="client",
                value=url,
            ) from None
    return made


def twin(client: object) -> AsyncClient:
    """The asyncio client aiolock's engine uses for `client` (made on first use, then the
    same one for as long as `client` lives in this process); `TypeError` for anything but
    a synchronous client of redis-py or valkey-py, or a URL."""
    if isinstance(client, str):
        return _from_url(client)
    made = _twins.get(client) if _weakly_held(client) else None
    if made is not None:
        return made
    library = _library(client)
    if library is None:
        raise _refuse(client)
    cluster = library.RedisCluster if library.__name__ == "redis" else library.ValkeyCluster
    made = _cluster(library, client) if isinstance(client, cluster) else _single(library, client)
    _twins[client] = made
    weakref.finalize(client, _close_soon, made)
    return made


_closing: set[Any] = set()


def _close_soon(made: AsyncClient) -> None:
    """The synchronous client is gone: close its twin on the portal's loop (if it runs;
    else the twin was closed when it stopped)."""
    running = _portal.running_portal()
    if running is None or running.loop.is_closed():
        return

    def close() -> None:
        task = running.loop.create_task(_close(made))
        _closing.add(task)
        task.add_done_callback(_closing.discard)

    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
        running.loop.call_soon_threadsafe(close)


def _weakly_held(client: object) -> bool:
    try:
        weakref.ref(client)
    except TypeError:
        return False
    return True


def twins(clients: object) -> tuple[AsyncClient, ...]:
    """The twins of a Redlock's clients (a list or tuple of them)."""
    if not isinstance(clients, (list, tuple)):
        raise TypeError(
            f"clients must be a list or tuple of synchronous clients, got {type(clients).__name__}"
        )
    return tuple(twin(client) for client in clients)


async def close_twins() -> None:
    """On the portal's loop, as it stops: close every twin (their pools' connections); the
    next use makes new ones."""
    made = [*_twins.values(), *_by_url.values()]
    _twins.clear()
    _by_url.clear()
    for client in made:
        await _close(client)


async def _close(client: AsyncClient) -> None:
    """Close a twin and its pool (which it was given, so does not close by itself)."""
    with contextlib.suppress(Exception):
        await client.aclose()
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        with contextlib.suppress(Exception):
            await pool.disconnect()
        # A Sentinel twin's pool asks Sentinels of its own: their connections too.
        for sentinel in getattr(getattr(pool, "sentinel_manager", None), "sentinels", ()):
            with contextlib.suppress(Exception):
                await sentinel.aclose()


def _forget_twins() -> None:
    """In a forked child: the twins are the parent's (their sockets too): kept alive, never
    used again."""
    _portal.forget([*_twins.values(), *_by_url.values()])
    _twins.clear()
    _by_url.clear()


_portal.on_fork(_forget_twins)
