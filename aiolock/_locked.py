"""`@locked`: run an async function under a lock named from its arguments."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, overload

from ._config import LockConfig
from ._glue import ClientSource, NameTemplate, client_source
from ._lock import Lock
from .errors import AcquireTimeoutError, ConfigError

__all__ = ("locked",)

logger = logging.getLogger("aiolock")

P = ParamSpec("P")
R = TypeVar("R")

_LEASE_PARAMETER = "lease"


class _Locked(Protocol):
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...


class _LockedOrSkipped(Protocol):
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Callable[P, Coroutine[Any, Any, R | None]]: ...


@overload
def locked(
    name: str,
    *,
    client: ClientSource,
    on_busy: Literal["skip"],
    ttl: float = ...,
    timeout: float | None = ...,
    renew: bool = ...,
    renew_interval: float | None = ...,
    max_hold: float | None = ...,
    prefix: str = ...,
    replicas: int = ...,
    replica_timeout: float | None = ...,
) -> _LockedOrSkipped: ...


@overload
def locked(
    name: str,
    *,
    client: ClientSource,
    on_busy: Literal["raise"] | None = ...,
    ttl: float = ...,
    timeout: float | None = ...,
    renew: bool = ...,
    renew_interval: float | None = ...,
    max_hold: float | None = ...,
    prefix: str = ...,
    replicas: int = ...,
    replica_timeout: float | None = ...,
) -> _Locked: ...


def locked(
    name: str,
    *,
    client: ClientSource,
    on_busy: Literal["raise", "skip"] | None = None,
    ttl: float = 30.0,
    timeout: float | None = None,
    renew: bool = True,
    renew_interval: float | None = None,
    max_hold: float | None = None,
    prefix: str = "aiolock",
    replicas: int = 0,
    replica_timeout: float | None = None,
) -> _Locked | _LockedOrSkipped:
    """Decorate an async function so each call runs holding a lock named from its arguments.

    ```python
    @locked("orders:{order_id}", client=get_redis, ttl=10, timeout=0, on_busy="skip")
    async def fulfil(order_id: int, *, lease: Lease | None = None) -> None:
        assert lease is not None  # given by @locked
        await db.ship(order_id, fence=lease.fencing_token)
    ```

    The name is formatted (`str.format` syntax) from the call's arguments, bound to the
    function's signature with defaults applied: `fulfil(42)` locks `"orders:42"`. A field
    may reach into an argument (`"{order.id}"`). If the function has a parameter named
    `lease`, it receives the `Lease` (declare it `lease: Lease | None = None` so callers,
    and type checkers, leave it out). The body runs guarded by the lease: if the lease is
    lost, the call is cancelled and raises `LeaseLostError`.

    The decorated function keeps its signature for type checkers (with `on_busy="skip"`
    its return type becomes `R | None`).

    Args:
        name: the lock name template; every field must name a parameter of the function.
        client: a `redis.asyncio.Redis`, or a function of no arguments returning one,
            called at each call (for a client created at application startup).
        on_busy: what a call does when the lock stays held by someone else for the whole
            `timeout`: `"raise"` `AcquireTimeoutError`, or `"skip"` the call and return
            None. Required when `timeout` is not None (there is no default guess);
            may be left out with `timeout=None`, where a call waits until it gets the lock.
        ttl: as for `Lock`.
        timeout: as for `Lock` (None: wait as long as it takes).
        renew: as for `Lock`.
        renew_interval: as for `Lock`.
        max_hold: as for `Lock`.
        prefix: as for `Lock`.
        replicas: as for `Lock` (0: wait for no replica).
        replica_timeout: as for `Lock`.

    Raises:
        TypeError: at decoration, a function that is not `async def`, a positional-only
            `lease` parameter, or arguments of the wrong type.
        ConfigError: at decoration, a template field that names no parameter (the
            message names it), a missing or unknown `on_busy`, or a `Lock` setting out of
            range; at a call, arguments that make an invalid lock name.

    Cancellation:
        As for `async with Lock(...)`: a call cancelled while waiting leaves no lock held;
        one cancelled while running releases the lock before the cancellation propagates.

    Added in 0.2.
    """
    template = NameTemplate(name)
    source = client_source(client)
    LockConfig.cached(
        ttl=ttl,
        renew=renew,
        renew_interval=renew_interval,
        timeout=timeout,
        max_hold=max_hold,
        prefix=prefix,
        replicas=replicas,
        replica_timeout=replica_timeout,
    )
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
    skip = on_busy == "skip"

    def decorate(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"@locked decorates async functions (async def), got {fn!r}"
            )  # fmt: skip
        signature = inspect.signature(fn)
        lease_param = signature.parameters.get(_LEASE_PARAMETER)
        if lease_param is not None and lease_param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(
                f"{fn.__qualname__}: the 'lease' parameter must accept a keyword "
                "(it is passed as lease=...)"
            )
        available = [p for p in signature.parameters if p != _LEASE_PARAMETER]
        template.check_fields(available, argument="name", where=f"{fn.__qualname__}()")

        @functools.wraps(fn)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if lease_param is not None and kwargs.get(_LEASE_PARAMETER) is not None:
                raise TypeError(
                    f"{fn.__qualname__}() got a lease argument: @locked passes the lease itself"
                )
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            lock = Lock(
                source(),
                template.format(bound.arguments),
                ttl=ttl,
                renew=renew,
                renew_interval=renew_interval,
                timeout=timeout,
                max_hold=max_hold,
                prefix=prefix,
                replicas=replicas,
                replica_timeout=replica_timeout,
            )
            try:
                lease = await lock.acquire()
            except AcquireTimeoutError as exc:
                if not skip:
                    raise
                logger.debug("aiolock: %s skipped: %s", fn.__qualname__, exc)
                return None  # type: ignore[return-value]  # the overload says R | None
            async with lease:
                if lease_param is not None:
                    bound.arguments[_LEASE_PARAMETER] = lease
                return await fn(*bound.args, **bound.kwargs)
            # A lease's block swallows only the cancellation its loss caused, and then
            # raises LeaseLostError instead: the call never gets here.
            raise AssertionError("unreachable")  # pragma: no cover

        return call

    return decorate
