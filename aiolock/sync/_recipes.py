"""`run_once` and `@locked` for synchronous code: the asyncio recipes' rules, the job or the
function run in the caller's thread."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal, ParamSpec, Protocol, TypeVar, Unpack, cast, overload

from .._model.config import MAX_SECONDS, check_seconds
from .._model.options import LockOptions, lock_config
from .._recipes.locked import check_on_busy, lease_parameter
from .._recipes.name_templates import NOTHING, NameTemplate, client_then_name
from .._recipes.run_once import (
    NAME_PREFIX,
    Markers,
    OnceResult,
    OnceStatus,
    check_job_key,
    check_node_timeout,
    done_marker,
    takes_lease,
)
from ..errors import AcquireTimeoutError
from . import _portal
from ._clients import SyncClient, twin, twins
from ._lease import Lease, LossCallback
from ._primitives import Lock, Redlock

__all__ = ("locked", "run_once")

logger = logging.getLogger("aiolock")

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
T = TypeVar("T")

_LEASE_PARAMETER = "lease"


def _sync_job(fn: object) -> bool:
    """`TypeError` unless `fn` is a plain callable (not async); whether it takes the lease
    (one required positional parameter) or nothing."""
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - what calling the object runs
    if (
        inspect.iscoroutinefunction(fn)
        or inspect.isasyncgenfunction(fn)
        or (not isinstance(fn, type) and inspect.iscoroutinefunction(call))
    ):
        raise TypeError(
            f"fn must be a plain (synchronous) function, got the async {fn!r}: use "
            "aiolock.run_once in async code"[:300]
        )
    if not callable(fn):
        raise TypeError(f"fn must be a function, got {type(fn).__name__}")
    return takes_lease(fn)


def run_once(
    client: SyncClient | Sequence[SyncClient],
    job_key: str,
    fn: Callable[[], T] | Callable[[Lease], T],
    *,
    retention: float,
    node_timeout: float | None = None,
    on_lost: LossCallback | None = None,
    **options: Unpack[LockOptions],
) -> OnceResult[T]:
    """Run `fn` in this thread unless the job `job_key` is done or running elsewhere (in
    any process, sync or asyncio code: the keys are `aiolock.run_once`'s); mark it done.

    ```python
    @app.task
    def nightly_report(day: str) -> None:
        aiolock.sync.run_once(redis_client, f"report:{day}", send_report, retention=2 * 86400)
    ```

    The same steps as `aiolock.run_once`: the done marker checked, the lock `once:JOB` taken
    (`timeout` 0 by default: RUNNING_ELSEWHERE if held), the marker checked again, `fn`
    run holding the lease, the lease confirmed by a token-guarded renewal, the marker
    written. `fn` cannot be cancelled: a lease lost while it runs is raised when it returns
    (`fn` can `lease.check()` between steps), and the job is not marked done.

    Args:
        client: a synchronous client or URL (as for `Lock`); or a list or tuple of them, of
            independent servers (a `Redlock`).
        job_key: the job's identity for this run (1 to 995 characters).
        fn: the job, a plain function called with no arguments, or with one: the `Lease`.
            An `async def` function is refused (`TypeError`) before anything is sent.
        retention: seconds the done marker is kept (0.001 to 1 year).
        node_timeout: with a list of clients, as for `aiolock.run_once` (a `ConfigError`
            with one client).
        on_lost: as for `Lock`.
        options: the settings of the job's lock, `LockOptions` (`timeout` 0 by default).

    Returns:
        An `OnceResult`: `status`, and `value` (what `fn` returned) when it ran.

    Raises:
        LeaseLostError: the lease was lost while `fn` ran, or before the marker was written.
        BackendError: Redis could not be reached; if `fn` ran, it is not marked done.
        TypeError, ConfigError: bad arguments, before anything is sent to Redis.
        Whatever `fn` raised: not marked done.

    Interruption:
        Ctrl-C while waiting for the lock leaves nothing held; while `fn` runs, the lock is
        released on the way out and the job is not marked done.

    Added in 0.1.
    """
    redlock = isinstance(client, (list, tuple))
    aio_clients = twins(client) if redlock else (twin(client),)
    job_key = check_job_key(job_key)
    pass_lease = _sync_job(fn)
    retention_s = check_seconds("retention", retention, minimum=0.001, maximum=MAX_SECONDS)
    lock_config("run_once()", options, timeout=0)
    settings: LockOptions = {"timeout": 0, **options}
    check_node_timeout(redlock, node_timeout)
    lock: Lock | Redlock
    if isinstance(client, (list, tuple)):
        lock = Redlock(
            client, NAME_PREFIX + job_key, node_timeout=node_timeout, on_lost=on_lost, **settings
        )
    else:
        lock = Lock(cast(SyncClient, client), NAME_PREFIX + job_key, on_lost=on_lost, **settings)
    _portal.check_caller("run_once()")
    run = _portal.portal().run

    async def markers_of() -> Markers:  # (a Redlock's are read through its quorum's runtime)
        return Markers(lock._primitive(), aio_clients[0])

    markers = run(markers_of)
    found = run(markers.read)
    if found is not None:
        return OnceResult(status=OnceStatus.ALREADY_DONE, job_key=job_key, marker=found)
    try:
        lease = lock.acquire()
    except AcquireTimeoutError as exc:
        return OnceResult(status=OnceStatus.RUNNING_ELSEWHERE, job_key=job_key, holder=exc.holder)
    with lease:
        found = run(markers.read)
        if found is not None:
            return OnceResult(status=OnceStatus.ALREADY_DONE, job_key=job_key, marker=found)
        value = fn(lease) if pass_lease else fn()  # type: ignore[call-arg]
        lease.extend()  # still ours? (LeaseLostError if not: no marker)
        marker, payload = done_marker(lease.fencing_token)
        run(lambda: markers.write(payload, max(1, round(retention_s * 1000))))
    return OnceResult(status=OnceStatus.RAN, job_key=job_key, value=value, marker=marker)


class _TakesLeaseFirst(Protocol[P, R_co]):
    def __call__(self, lease: Lease, *args: P.args, **kwargs: P.kwargs) -> R_co: ...


class _Locked(Protocol):
    @overload
    def __call__(self, fn: _TakesLeaseFirst[P, R], /) -> Callable[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R]: ...


class _LockedOrSkipped(Protocol):
    @overload
    def __call__(self, fn: _TakesLeaseFirst[P, R], /) -> Callable[P, R | None]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R | None]: ...


def _source(client: object) -> Callable[[], object]:
    """The client (or a Redlock's clients) for each call: given, or made by a factory
    (called at each call; its result is checked then)."""
    if isinstance(client, (list, tuple)):
        twins(client)
        return lambda: client
    if isinstance(client, str) or not callable(client):
        twin(client)
        return lambda: client
    return client


def _lock_for(
    clients: object, name: str, on_lost: LossCallback | None, options: LockOptions
) -> Lock | Redlock:
    if isinstance(clients, (list, tuple)):
        return Redlock(clients, name, on_lost=on_lost, **options)
    return Lock(cast(SyncClient, clients), name, on_lost=on_lost, **options)


@overload
def locked(
    client: Any, name: str, /, *, on_busy: Literal["skip"], on_lost: LossCallback | None = ...,
    **options: Unpack[LockOptions],
) -> _LockedOrSkipped: ...  # fmt: skip


@overload
def locked(
    client: Any, name: str, /, *, on_busy: Literal["raise"] | None = ...,
    on_lost: LossCallback | None = ..., **options: Unpack[LockOptions],
) -> _Locked: ...  # fmt: skip


@overload
def locked(
    name: str, *, client: Any, on_busy: Literal["skip"], on_lost: LossCallback | None = ...,
    **options: Unpack[LockOptions],
) -> _LockedOrSkipped: ...  # fmt: skip


@overload
def locked(
    name: str, *, client: Any, on_busy: Literal["raise"] | None = ...,
    on_lost: LossCallback | None = ..., **options: Unpack[LockOptions],
) -> _Locked: ...  # fmt: skip


def locked(
    client_or_name: Any = NOTHING,
    name_after_client: Any = NOTHING,
    /,
    *,
    name: Any = NOTHING,
    client: Any = NOTHING,
    on_busy: Literal["raise", "skip"] | None = None,
    on_lost: LossCallback | None = None,
    **options: Unpack[LockOptions],
) -> _Locked | _LockedOrSkipped:
    """Decorate a plain function so each call runs holding a lock named from its arguments,
    as `aiolock.locked` does for async functions.

    ```python
    @aiolock.sync.locked(redis_client, "invoices:{customer_id}", timeout=0, on_busy="skip")
    def bill(lease: aiolock.sync.Lease, customer_id: int) -> None:
        db.charge(customer_id, fence=lease.fencing_token)
    ```

    The name, the `lease` parameter, `on_busy` and the settings are `aiolock.locked`'s. The
    function cannot be cancelled: a lease lost while it runs is raised when it returns
    (`LeaseLostError`), or is noted on the exception it raised.

    Args:
        client: a synchronous client or URL (as for `Lock`), a function of no arguments
            returning one (called at each call), or a list or tuple of them (a `Redlock`).
        name: the lock name template; every field must name a parameter of the function.
        on_busy: "raise" (`AcquireTimeoutError`) or "skip" (the call returns None) when
            the lock stays held for the whole `timeout`; required unless `timeout` is None.
        on_lost: as for `Lock`.
        options: the settings of each call's lock, `LockOptions`.

    Raises:
        TypeError: at decoration, an async function (use `aiolock.locked`), a `lease`
            parameter that cannot be passed by keyword, arguments of the wrong type; at a
            call, arguments that do not fit the signature, or a `lease` passed by the caller.
        ConfigError: as for `aiolock.locked`.

    Interruption:
        Ctrl-C while waiting leaves no lock held; while the function runs, the lock is
        released on the way out.

    Added in 0.1.
    """
    client, name = client_then_name("locked()", client_or_name, name_after_client, name, client)
    template = NameTemplate(name)
    source = _source(client)
    lock_config("locked()", options)
    if isinstance(client, (list, tuple)):
        Redlock(client, "-", **options)  # refuses what a Redlock does not take
    skip = check_on_busy(on_busy, options.get("timeout"))

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"aiolock.sync.locked decorates plain (synchronous) functions, got the async "
                f"{fn!r}: use aiolock.locked"
            )
        signature, lease_param, outer = lease_parameter(fn)
        template.check_fields(outer.parameters, argument="name", where=f"{fn.__qualname__}()")
        refusal = "" if lease_param is None else " (the lease is passed by @locked, not by callers)"

        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if lease_param is not None and _LEASE_PARAMETER in kwargs:
                raise TypeError(
                    f"{fn.__qualname__}() got a lease argument: @locked passes the lease itself"
                )
            try:
                bound = outer.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{fn.__qualname__}(): {exc}{refusal}") from None
            bound.apply_defaults()
            lock = _lock_for(source(), template.format(bound.arguments), on_lost, options)
            try:
                lease = lock.acquire()
            except AcquireTimeoutError as exc:
                if not skip:
                    raise
                logger.debug("aiolock: %s skipped: %s", fn.__qualname__, exc)
                return None  # type: ignore[return-value]  # the overload says R | None
            with lease:
                if lease_param is None:
                    return fn(*bound.args, **bound.kwargs)
                full = inspect.BoundArguments(
                    signature, {**bound.arguments, _LEASE_PARAMETER: lease}
                )
                return fn(*full.args, **full.kwargs)

        call.__signature__ = outer  # type: ignore[attr-defined]
        return call

    return decorate  # type: ignore[return-value]
