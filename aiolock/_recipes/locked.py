"""`@locked`: run an async function under a lock named from its arguments."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, Unpack, overload

from .._engine.lease import Lease
from .._model.options import LockOptions, lock_config
from ..errors import AcquireTimeoutError, ConfigError
from .name_templates import (
    NOTHING,
    ClientSource,
    NameTemplate,
    check_for,
    client_source,
    client_then_name,
    lock_for,
)

__all__ = ("check_on_busy", "lease_parameter", "locked")

logger = logging.getLogger("aiolock")

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

_LEASE_PARAMETER = "lease"


def check_on_busy(on_busy: object, timeout: object) -> bool:
    """Whether busy calls are skipped (`on_busy="skip"`); `ConfigError` for a value other
    than "raise" or "skip", or for none with a `timeout` other than None."""
    if on_busy is None:
        if timeout is not None:
            raise ConfigError(
                f"on_busy is required with timeout={timeout!r}: 'raise' (AcquireTimeoutError) "
                "or 'skip' (the call returns None)",
                argument="on_busy",
                value=on_busy,
            )
    elif on_busy not in ("raise", "skip"):
        raise ConfigError(
            f"on_busy must be 'raise' or 'skip', got {on_busy!r}",
            argument="on_busy",
            value=on_busy,
        )
    return on_busy == "skip"


def lease_parameter(
    fn: Callable[..., object],
) -> tuple[inspect.Signature, inspect.Parameter | None, inspect.Signature]:
    """`fn`'s signature, its `lease` parameter (None if it has none), and the signature its
    callers see (without it); `TypeError` for a `lease` that cannot be passed by keyword."""
    signature = inspect.signature(fn)
    lease_param = signature.parameters.get(_LEASE_PARAMETER)
    if lease_param is not None and lease_param.kind not in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    ):
        raise TypeError(
            f"{fn.__qualname__}: the 'lease' parameter must be one parameter that "
            f"accepts a keyword (it is passed as lease=...), got {lease_param}"
        )
    # What callers pass: every parameter but the lease.
    outer = signature.replace(
        parameters=[p for p in signature.parameters.values() if p is not lease_param]
    )
    return signature, lease_param, outer


class _TakesLeaseFirst(Protocol[P, R_co]):
    """An async function whose first parameter is `lease`: typed without it once decorated
    (a parameter after the first cannot be taken out of a `ParamSpec`)."""

    def __call__(
        self, lease: Lease, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R_co]: ...


class _Locked(Protocol):
    @overload
    def __call__(self, fn: _TakesLeaseFirst[P, R], /) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...


class _LockedOrSkipped(Protocol):
    @overload
    def __call__(
        self, fn: _TakesLeaseFirst[P, R], /
    ) -> Callable[P, Coroutine[Any, Any, R | None]]: ...
    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Callable[P, Coroutine[Any, Any, R | None]]: ...


@overload
def locked(
    client: ClientSource,
    name: str,
    /,
    *,
    on_busy: Literal["skip"],
    **options: Unpack[LockOptions],
) -> _LockedOrSkipped: ...


@overload
def locked(
    client: ClientSource,
    name: str,
    /,
    *,
    on_busy: Literal["raise"] | None = ...,
    **options: Unpack[LockOptions],
) -> _Locked: ...


@overload
def locked(
    name: str,
    *,
    client: ClientSource,
    on_busy: Literal["skip"],
    **options: Unpack[LockOptions],
) -> _LockedOrSkipped: ...


@overload
def locked(
    name: str,
    *,
    client: ClientSource,
    on_busy: Literal["raise"] | None = ...,
    **options: Unpack[LockOptions],
) -> _Locked: ...


def locked(
    client_or_name: Any = NOTHING,
    name_after_client: Any = NOTHING,
    /,
    *,
    name: Any = NOTHING,
    client: Any = NOTHING,
    on_busy: Literal["raise", "skip"] | None = None,
    **options: Unpack[LockOptions],
) -> _Locked | _LockedOrSkipped:
    """Decorate an async function so each call runs holding a lock named from its arguments.

    ```python
    @locked(get_redis, "orders:{order_id}", ttl=10, timeout=0, on_busy="skip")
    async def fulfil(lease: Lease, order_id: int) -> None:
        await db.ship(order_id, fence=lease.fencing_token)

    await fulfil(42)  # holding "orders:42"
    ```

    The name is formatted (`str.format` syntax) from the call's arguments, bound to the
    function's signature with defaults applied: `fulfil(42)` locks `"orders:42"`. A field
    may reach into an argument (`"{order.id}"`). If the function has a parameter named
    `lease`, it receives the `Lease`, with or without a default (`lease: Lease`); callers
    leave it out, and one that passes it gets a `TypeError`. The body runs guarded by the
    lease: if the lease is lost, the call is cancelled and raises `LeaseLostError`.

    The decorated function keeps its signature, without `lease`, for `inspect.signature`
    (`__signature__`) and for type checkers (with `on_busy="skip"` its return type becomes
    `R | None`). For type checkers, a `lease` parameter is left out only when it is the
    first one (a `ParamSpec` cannot lose a later parameter): elsewhere, declare it
    `lease: Lease | None = None` so that type-checked callers may leave it out.

    The client comes first, as for `Lock` (`locked(redis, "orders:{order_id}")`), or by
    keyword after the name (`locked("orders:{order_id}", client=redis)`).

    Args:
        client: a `redis.asyncio.Redis` or `RedisCluster` (or valkey-py's
            `valkey.asyncio.Valkey` or `ValkeyCluster`), or a function of no arguments
            returning one, called at each call (for a client created at application
            startup); or a list or tuple of clients of independent servers, for a
            `Redlock` over them.
        name: the lock name template; every field must name a parameter of the function.
        on_busy: what a call does when the lock stays held by someone else for the whole
            `timeout`: `"raise"` `AcquireTimeoutError`, or `"skip"` the call and return
            None. Required when `timeout` is not None (there is no default guess);
            may be left out with `timeout=None`, where a call waits until it gets the lock.
        options: the settings of each call's `Lock`, `LockOptions`, with their defaults:
            `ttl`, `renew`, `renew_interval`, `timeout` (None: wait as long as it takes),
            `max_hold`, `prefix`, `retain`, `hold_stats`, `replicas`, `replica_timeout`.

    Raises:
        TypeError: at decoration, a function that is not `async def`, a `lease` parameter
            that is positional-only or `*lease`/`**lease`, or arguments of the wrong type;
            at a call, arguments that do not fit the function's signature, or a `lease`
            passed by the caller.
        ConfigError: at decoration, a template field that names no parameter (the
            message names it), a missing or unknown `on_busy`, or a `Lock` setting out of
            range; at a call, arguments that make an invalid lock name.

    Cancellation:
        As for `async with Lock(...)`: a call cancelled while waiting leaves no lock held;
        one cancelled while running releases the lock before the cancellation propagates.

    Added in 0.1.
    """
    client, name = client_then_name("locked()", client_or_name, name_after_client, name, client)
    template = NameTemplate(name)
    source = client_source(client)
    lock_config("locked()", options)
    check_for(client, options)
    skip = check_on_busy(on_busy, options.get("timeout"))

    def decorate(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"@locked decorates async functions (async def), got {fn!r}"
            )  # fmt: skip
        signature, lease_param, outer = lease_parameter(fn)
        template.check_fields(outer.parameters, argument="name", where=f"{fn.__qualname__}()")
        refusal = "" if lease_param is None else " (the lease is passed by @locked, not by callers)"

        @functools.wraps(fn)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if lease_param is not None and _LEASE_PARAMETER in kwargs:
                raise TypeError(
                    f"{fn.__qualname__}() got a lease argument: @locked passes the lease itself"
                )
            try:
                bound = outer.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{fn.__qualname__}(): {exc}{refusal}") from None
            bound.apply_defaults()
            lock = lock_for(source(), template.format(bound.arguments), **options)
            try:
                lease = await lock.acquire()
            except AcquireTimeoutError as exc:
                if not skip:
                    raise
                logger.debug("aiolock: %s skipped: %s", fn.__qualname__, exc)
                return None  # type: ignore[return-value]  # the overload says R | None
            async with lease:
                if lease_param is None:
                    return await fn(*bound.args, **bound.kwargs)
                full = inspect.BoundArguments(
                    signature, {**bound.arguments, _LEASE_PARAMETER: lease}
                )
                return await fn(*full.args, **full.kwargs)
            # A lease's block swallows only the cancellation its loss caused, and then
            # raises LeaseLostError instead: the call never gets here.
            raise AssertionError("unreachable")  # pragma: no cover

        call.__signature__ = outer  # type: ignore[attr-defined]
        return call

    return decorate  # type: ignore[return-value]
