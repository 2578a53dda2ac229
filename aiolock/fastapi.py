"""FastAPI: hold a lock for the duration of a request handler.

Needs the `fastapi` extra (`pip install "aiolock-redis[fastapi]"`, FastAPI ≥ 0.121).

```python
from aiolock import Lease
from aiolock.fastapi import locked_request

@app.post("/orders/{order_id}/place")
async def place_order(
    order_id: int,
    lease: Lease = locked_request("orders:{order_id}", client=lambda: app.state.redis, ttl=10),
) -> Order:
    return await orders.place(order_id, fence=lease.fencing_token)
```

- The lock's name comes from the request: each field of the template is a path parameter
  of the route, or else a query parameter (required, validated by FastAPI, and in the
  OpenAPI schema). For values that need converting (`"042"` and `"42"` are different
  names) or for anything else (a header, the current user), pass a function instead of
  a template: FastAPI resolves it as a dependency and its result is the name.
- Busy (by default the lock is tried once, `timeout=0`): the request fails at once with
  `busy_status` (409 Conflict or 429 Too Many Requests) and a `Retry-After` header.
- The handler runs guarded by the lease: if the lease is lost, the handler is cancelled
  at its next `await` (nothing it would have written after that point is written) and the
  client gets 503 Service Unavailable.
- Redis unreachable (`BackendError` while taking the lock): 503 Service Unavailable with
  `Retry-After: 1`; the handler does not run.
- The process shutting down (`release_on_signals(drain=...)` cancelled the handler just
  before the server's graceful timeout ended): 503 with `Retry-After: 1`, never a 500.
- The lock is released when the handler returns, *before* the response is sent (the
  dependency has `scope="function"`): a client that sees the response can lock again at
  once. A `StreamingResponse`'s body is produced after that and is not protected.

Use `async def` handlers: a plain `def` handler runs in a worker thread, which a loss
cannot cancel (the client still gets 503 if the lease was lost meanwhile, but the
handler's writes were not stopped).

A `BackendError` the handler raises itself (its own Redis calls) is not this request's
lock's, and passes through as any error of the handler.
"""

from __future__ import annotations

import asyncio
import inspect
import keyword
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, Literal, TypeAlias, Unpack, overload

try:
    import fastapi
    from fastapi import HTTPException
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'aiolock.fastapi needs the "fastapi" extra: pip install "aiolock-redis[fastapi]"'
    ) from exc

from ._engine.lease import Lease
from ._model.options import LockOptions, lock_config
from ._recipes.name_templates import (
    NOTHING,
    UNAVAILABLE,
    UNAVAILABLE_RETRY_AFTER,
    ClientSource,
    NameTemplate,
    check_for,
    client_source,
    client_then_name,
    lock_for,
    retry_after_header,
)
from ._recipes.shutdown import is_shutdown
from .errors import AcquireTimeoutError, BackendError, ConfigError, LeaseLostError

__all__ = ("locked_request",)

BUSY_STATUSES: Final = (409, 429)
LOST_STATUS: Final = 503
_NAME_PARAMETER: Final = "aiolock_lock_name"


NameSource: TypeAlias = str | Callable[..., str] | Callable[..., Awaitable[str]]
"""A lock name template, or a function FastAPI resolves as a dependency."""


@overload
def locked_request(
    client: ClientSource,
    name: NameSource,
    /,
    *,
    busy_status: Literal[409, 429] = ...,
    **options: Unpack[LockOptions],
) -> Any: ...


@overload
def locked_request(
    name: NameSource,
    *,
    client: ClientSource,
    busy_status: Literal[409, 429] = ...,
    **options: Unpack[LockOptions],
) -> Any: ...


def locked_request(
    client_or_name: Any = NOTHING,
    name_after_client: Any = NOTHING,
    /,
    *,
    name: Any = NOTHING,
    client: Any = NOTHING,
    busy_status: Literal[409, 429] = 409,
    **options: Unpack[LockOptions],
) -> Any:
    """A FastAPI dependency that holds a lock while the handler runs; its value is the `Lease`.

    Use it as a parameter's default (`lease: Lease = locked_request(...)`), in
    `Annotated[Lease, locked_request(...)]`, or in a route's `dependencies=[...]`.

    The client comes first, as for `Lock` (`locked_request(get_redis, "orders:{id}")`), or
    by keyword after the name (`locked_request("orders:{id}", client=get_redis)`).

    Args:
        client: a `redis.asyncio.Redis` or `RedisCluster` (or valkey-py's
            `valkey.asyncio.Valkey` or `ValkeyCluster`), or a function of no arguments
            returning one (`lambda: app.state.redis` for a client made at startup).
        name: a template such as `"orders:{order_id}"` whose fields are path or query
            parameters, or a function FastAPI resolves as a dependency, returning the name.
        busy_status: the status of a request that did not get the lock in time: 409
            (Conflict: someone else is changing this resource) or 429 (Too Many
            Requests: slow down). Both carry `Retry-After` (whole seconds, at least 1).
        options: the settings of each request's `Lock`, `LockOptions`, with their
            defaults but one: `timeout` is 0 (one try, fail fast; None waits as long as it
            takes). `ttl`, `renew`, `renew_interval`, `timeout`, `max_hold`, `prefix`,
            `retain`, `hold_stats`, `replicas`, `replica_timeout`.

    Returns:
        A `fastapi.params.Depends` with `scope="function"`.

    Raises:
        TypeError, ConfigError: bad arguments, when the route is declared.

    Added in 0.1.
    """
    client, name = client_then_name(
        "locked_request()", client_or_name, name_after_client, name, client
    )
    if busy_status not in BUSY_STATUSES:
        raise ConfigError(
            f"busy_status must be 409 or 429, got {busy_status!r}",
            argument="busy_status",
            value=busy_status,
        )
    source = client_source(client)
    lock_config("locked_request()", options, timeout=0)
    settings: LockOptions = {"timeout": 0, **options}
    check_for(client, settings)
    template: NameTemplate | None = None
    parameters: list[inspect.Parameter] = []
    if isinstance(name, str):
        template = NameTemplate(name)
        for field in template.fields:
            if not field.isidentifier() or keyword.iskeyword(field) or field == _NAME_PARAMETER:
                raise ConfigError(
                    f"name {name!r}: field {field!r} is not a possible parameter name",
                    argument="name",
                    value=name,
                )
            parameters.append(
                inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, annotation=str)
            )
    elif callable(name):
        parameters.append(
            inspect.Parameter(
                _NAME_PARAMETER,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=str,
                default=fastapi.Depends(name),
            )
        )
    else:
        raise TypeError(f"name must be a str template or a function, got {type(name).__name__}")

    async def hold_lock(**values: Any) -> AsyncIterator[Lease]:
        if template is None:
            lock_name = values[_NAME_PARAMETER]
        else:
            try:
                lock_name = template.format(values)
            except ConfigError as exc:
                raise HTTPException(status_code=422, detail=str(exc)) from None
        lock = lock_for(source(), lock_name, **settings)
        try:
            lease = await lock.acquire()
        except AcquireTimeoutError as exc:
            raise HTTPException(
                status_code=busy_status,
                detail="busy: another request holds the lock on this resource",
                headers={"Retry-After": retry_after_header(exc)},
            ) from exc
        except BackendError as exc:
            raise HTTPException(
                status_code=UNAVAILABLE,
                detail=f"Redis could not lock this resource: {exc}",
                headers={"Retry-After": UNAVAILABLE_RETRY_AFTER},
            ) from exc
        try:
            async with lease:
                yield lease
        except LeaseLostError as exc:
            if exc.fencing_token != lease.fencing_token or exc.name != lease.name:
                raise  # another lock's loss, raised by the handler itself
            raise HTTPException(
                status_code=LOST_STATUS,
                detail="the lock on this resource was lost; the request was stopped",
            ) from exc
        except asyncio.CancelledError as exc:
            if not is_shutdown(exc):
                raise
            raise shutting_down() from None

    hold_lock.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        parameters, return_annotation=AsyncIterator[Lease]
    )
    return fastapi.Depends(hold_lock, scope="function")


def shutting_down() -> HTTPException:
    """503 for a request whose handler `release_all` cancelled (the process is shutting
    down: `release_on_signals(drain=...)`), its task no longer counted as cancelled so that
    the answer is sent."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    return HTTPException(
        status_code=UNAVAILABLE,
        detail="the server is shutting down; the request was stopped",
        headers={"Retry-After": UNAVAILABLE_RETRY_AFTER},
    )
