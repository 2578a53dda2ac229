"""aiohttp: hold a lock for the duration of a request handler.

Needs the `aiohttp` extra (`pip install "aiolock-redis[aiohttp]"`).

```python
from aiohttp import web
from aiolock import Lease
from aiolock.aiohttp import locked_handler

REDIS = web.AppKey("redis", redis.asyncio.Redis)

@routes.post("/orders/{order_id}/place")
@locked_handler("orders:{order_id}", client=REDIS, ttl=10)
async def place_order(request: web.Request, lease: Lease) -> web.Response:
    order = await orders.place(request.match_info["order_id"], fence=lease.fencing_token)
    return web.json_response(order)
```

- The lock's name comes from the request: each field of the template is taken from the
  route's `match_info`, or else from the query string (a request without it gets 400).
- Busy (by default the lock is tried once, `timeout=0`): `busy_status` (409 Conflict or
  429 Too Many Requests) with a `Retry-After` header, at once.
- Redis unreachable (`BackendError` while taking the lock): 503 Service Unavailable with
  `Retry-After: 1`; the handler does not run.
- The handler runs guarded by the lease: if the lease is lost it is cancelled at its
  next `await`, and the client gets 503 Service Unavailable.
- The process shutting down (`release_on_signals(drain=...)` cancelled the handler just
  before the server's graceful timeout ended): 503 with `Retry-After: 1`, never a 500.
- The lock is released when the handler returns, before aiohttp sends the response. A
  handler that streams (`StreamResponse.prepare()`) sends while it holds the lock; if the
  lease is lost after the headers went out, the connection is closed instead of a 503.
- The handler takes the request, and optionally the `Lease` as a second argument.

A `BackendError` the handler raises itself (its own Redis calls) is not this request's
lock's, and propagates as from any handler.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Literal, TypeAlias, TypeVar, Unpack, overload

import redis.asyncio

try:
    from aiohttp import web
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'aiolock.aiohttp needs the "aiohttp" extra: pip install "aiolock-redis[aiohttp]"'
    ) from exc

from ._engine.lease import Lease
from ._model.options import LockOptions, lock_config
from ._recipes.name_templates import (
    NOTHING,
    UNAVAILABLE_RETRY_AFTER,
    Clients,
    NameTemplate,
    check_for,
    client_source,
    client_then_name,
    lock_for,
    retry_after_header,
)
from ._recipes.shutdown import is_shutdown
from ._transport.clients import AsyncClient
from .errors import AcquireTimeoutError, BackendError, ConfigError, LeaseLostError

__all__ = ("locked_handler",)

BUSY_STATUSES: Final = (409, 429)

ResponseT = TypeVar("ResponseT", bound=web.StreamResponse)
Handler: TypeAlias = Callable[[web.Request], Awaitable[ResponseT]]
HandlerWithLease: TypeAlias = Callable[[web.Request, Lease], Awaitable[ResponseT]]
ClientOption: TypeAlias = (
    AsyncClient
    | Sequence[AsyncClient]
    | Callable[[], AsyncClient]
    | web.AppKey[redis.asyncio.Redis]
    | web.AppKey[redis.asyncio.RedisCluster]
    # A key of a valkey-py client (AppKey is invariant, and valkey is not imported here):
    # what it holds is checked when a request comes.
    | web.AppKey[Any]
)


class _Decorator:
    """What `locked_handler(...)` returns: typed for handlers with and without the lease."""

    __slots__ = ("_wrap",)

    def __init__(
        self,
        wrap: Callable[
            [Callable[..., Awaitable[web.StreamResponse]], bool], Handler[web.StreamResponse]
        ],
    ) -> None:
        self._wrap = wrap

    @overload
    def __call__(self, handler: HandlerWithLease[ResponseT], /) -> Handler[ResponseT]: ...

    @overload
    def __call__(self, handler: Handler[ResponseT], /) -> Handler[ResponseT]: ...

    def __call__(
        self, handler: HandlerWithLease[ResponseT] | Handler[ResponseT], /
    ) -> Handler[ResponseT]:
        if not inspect.iscoroutinefunction(handler):
            raise TypeError(
                f"@locked_handler decorates async handlers (async def), got {handler!r}"
            )
        positional = [
            p
            for p in inspect.signature(handler).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(positional) not in (1, 2):
            raise TypeError(
                f"{handler.__qualname__} must take the request, and optionally the lease"
            )
        return self._wrap(handler, len(positional) == 2)  # type: ignore[return-value]


@overload
def locked_handler(
    client: ClientOption,
    name: str,
    /,
    *,
    busy_status: Literal[409, 429] = ...,
    **options: Unpack[LockOptions],
) -> _Decorator: ...


@overload
def locked_handler(
    name: str,
    *,
    client: ClientOption,
    busy_status: Literal[409, 429] = ...,
    **options: Unpack[LockOptions],
) -> _Decorator: ...


def locked_handler(
    client_or_name: Any = NOTHING,
    name_after_client: Any = NOTHING,
    /,
    *,
    name: Any = NOTHING,
    client: Any = NOTHING,
    busy_status: Literal[409, 429] = 409,
    **options: Unpack[LockOptions],
) -> _Decorator:
    """Decorate an aiohttp handler so it runs holding a lock named from the request.

    The client comes first, as for `Lock` (`locked_handler(REDIS, "orders:{order_id}")`),
    or by keyword after the name (`locked_handler("orders:{order_id}", client=REDIS)`).

    Args:
        client: a `redis.asyncio.Redis` or `RedisCluster` (or valkey-py's
            `valkey.asyncio.Valkey` or `ValkeyCluster`); a function of no arguments
            returning one; or a `web.AppKey` under which the application (or a parent
            application) keeps it.
        name: a template such as `"orders:{order_id}"`; each field is read from the
            request's `match_info`, else from its query string.
        busy_status: 409 (Conflict) or 429 (Too Many Requests), with `Retry-After`
            (whole seconds, at least 1), for a request that did not get the lock in time.
        options: the settings of each request's `Lock`, `LockOptions`, with their
            defaults but one: `timeout` is 0 (one try, fail fast; None waits as long as it
            takes). `ttl`, `renew`, `renew_interval`, `timeout`, `max_hold`, `prefix`,
            `retain`, `hold_stats`, `replicas`, `replica_timeout`.

    Raises:
        TypeError, ConfigError: bad arguments, or a handler that is not `async def` or
            does not take `(request)` or `(request, lease)`, at decoration.

    Added in 0.1.
    """
    client, name = client_then_name(
        "locked_handler()", client_or_name, name_after_client, name, client
    )
    if busy_status not in BUSY_STATUSES:
        raise ConfigError(
            f"busy_status must be 409 or 429, got {busy_status!r}",
            argument="busy_status",
            value=busy_status,
        )
    template = NameTemplate(name)
    lock_config("locked_handler()", options, timeout=0)
    settings: LockOptions = {"timeout": 0, **options}
    check_for(client, settings)
    if isinstance(client, web.AppKey):
        app_key: web.AppKey[Any] = client

        def resolve(request: web.Request) -> Clients:
            try:
                made = request.config_dict[app_key]
            except KeyError:
                raise RuntimeError(
                    f"no Redis client under {app_key!r} in the application: set "
                    "app[key] = redis.asyncio.Redis(...) at startup"
                ) from None
            return client_source(made)()

    else:
        source = client_source(client)

        def resolve(request: web.Request) -> Clients:
            return source()

    busy_error = web.HTTPConflict if busy_status == 409 else web.HTTPTooManyRequests

    def lock_name(request: web.Request) -> str:
        values: dict[str, str] = {}
        for field in template.fields:
            if field in request.match_info:
                values[field] = request.match_info[field]
            elif field in request.query:
                values[field] = request.query[field]
            else:
                raise web.HTTPBadRequest(text=f"missing query parameter {field!r}")
        try:
            return template.format(values)
        except ConfigError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None

    def wrap(
        handler: Callable[..., Awaitable[web.StreamResponse]], with_lease: bool
    ) -> Handler[web.StreamResponse]:
        @functools.wraps(handler)
        async def locked(request: web.Request) -> web.StreamResponse:
            lock = lock_for(resolve(request), lock_name(request), **settings)
            try:
                lease = await lock.acquire()
            except AcquireTimeoutError as exc:
                raise busy_error(
                    text="busy: another request holds the lock on this resource",
                    headers={"Retry-After": retry_after_header(exc)},
                ) from exc
            except BackendError as exc:
                raise web.HTTPServiceUnavailable(
                    text=f"Redis could not lock this resource: {exc}",
                    headers={"Retry-After": UNAVAILABLE_RETRY_AFTER},
                ) from exc
            try:
                async with lease:
                    if with_lease:
                        return await handler(request, lease)
                    return await handler(request)
            except LeaseLostError as exc:
                if exc.fencing_token != lease.fencing_token or exc.name != lease.name:
                    raise  # another lock's loss, raised by the handler itself
                raise web.HTTPServiceUnavailable(
                    text="the lock on this resource was lost; the request was stopped"
                ) from exc
            except asyncio.CancelledError as exc:
                if not is_shutdown(exc):
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()  # answered: no longer counted as cancelled
                raise web.HTTPServiceUnavailable(
                    text="the server is shutting down; the request was stopped",
                    headers={"Retry-After": UNAVAILABLE_RETRY_AFTER},
                ) from None
            raise AssertionError("unreachable")  # pragma: no cover - see @locked

        return locked

    return _Decorator(wrap)
