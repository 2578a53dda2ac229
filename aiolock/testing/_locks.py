"""Every primitive made busy or lost on purpose, for tests of code that uses aiolock: a
lock, a semaphore's permits, a read-write lock's sides (here), a Redlock, an election and
a multi-lock (`_quorum`, `_others`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Final, overload

from .._engine.lease import Lease
from .._engine.runtime import runtime_for
from .._lua.hash_leases import EXPIRE_LEASES
from .._lua.layout import LockKeys, permits_key
from .._model.config import check_name, check_prefix
from .._primitives.election import Election
from .._primitives.lock import Lock
from .._primitives.multilock import MultiLease, MultiLock
from .._primitives.redlock import Redlock
from .._primitives.rwlock import ReadLock, ReadWriteLock, WriteLock
from .._primitives.semaphore import Semaphore
from .._primitives.term import Term
from .._transport.call_options import CallOptions
from .._transport.clients import AsyncRedis, check_client
from ..errors import ConfigError, LeaseLostError
from ._others import OneServer, another_process, expire_other, hold_other

__all__ = ("expire_now", "hold_elsewhere")

_KINDS: Final = (
    "a Lock or a lock's name (str), a Semaphore, a ReadWriteLock's read() or write(), a "
    "Redlock, an Election or a MultiLock"
)
_MAX_SLOT: Final = 9999
"""The highest slot a semaphore's permit can have (its limit is at most 10,000)."""
_TIMEOUT: Final = 5.0
"""Longest wait for Redis to answer `expire_now`, seconds."""

Target = Lock | Semaphore | ReadLock | WriteLock | str | Redlock | Election | MultiLock


def _check_target(value: object, argument: str) -> Target:
    if isinstance(
        value, Lock | Semaphore | ReadLock | WriteLock | str | Redlock | Election | MultiLock
    ):
        return value
    hint = " (pass its read() or write())" if isinstance(value, ReadWriteLock) else ""
    raise TypeError(f"{argument} must be {_KINDS}, got {type(value).__name__}{hint}")


@overload
def hold_elsewhere(
    client: OneServer,
    name: Semaphore,
    *,
    permits: int | None = None,
    ttl: float = 30.0,
    timeout: float | None = 5.0,
) -> contextlib.AbstractAsyncContextManager[tuple[Lease, ...]]: ...


@overload
def hold_elsewhere(
    client: OneServer,
    name: Lock | ReadLock | WriteLock | str,
    *,
    ttl: float = 30.0,
    timeout: float | None = 5.0,
    prefix: str = "aiolock",
) -> contextlib.AbstractAsyncContextManager[Lease]: ...


@overload
def hold_elsewhere(
    client: Sequence[OneServer],
    name: Redlock,
    *,
    nodes: Sequence[int] | None = None,
    ttl: float = 30.0,
    timeout: float | None = 5.0,
) -> contextlib.AbstractAsyncContextManager[Lease]: ...


@overload
def hold_elsewhere(
    client: OneServer, name: Election, *, ttl: float = 30.0, timeout: float | None = 5.0
) -> contextlib.AbstractAsyncContextManager[Term]: ...


@overload
def hold_elsewhere(
    client: OneServer, name: MultiLock, *, ttl: float = 30.0, timeout: float | None = 5.0
) -> contextlib.AbstractAsyncContextManager[MultiLease]: ...


def hold_elsewhere(
    client: OneServer | Sequence[OneServer],
    name: Target,
    *,
    permits: int | None = None,
    nodes: Sequence[int] | None = None,
    ttl: float = 30.0,
    timeout: float | None = 5.0,
    prefix: str = "aiolock",
) -> contextlib.AbstractAsyncContextManager[Lease | tuple[Lease, ...] | Term | MultiLease]:
    """Hold a lock, a semaphore's permits or a side of a read-write lock for the duration of
    the block, as another process would.

    ```python
    async with hold_elsewhere(client, "orders:42"):             # a lock, by name
    async with hold_elsewhere(client, Lock(client, "orders:42")):
    async with hold_elsewhere(client, partner_api) as permits:  # every free permit
    async with hold_elsewhere(client, partner_api, permits=1):  # one permit
    async with hold_elsewhere(client, catalog.write()):         # the writer
    async with hold_elsewhere(client, catalog.read()):          # one reader
    async with hold_elsewhere([a, b, c], redlock):              # a Redlock, on every node
    async with hold_elsewhere([a, b, c], redlock, nodes=[0]):   # on node 0 only
    async with hold_elsewhere(client, election) as term:        # a leader elsewhere
    async with hold_elsewhere(client, accounts):                # a MultiLock's every name
    ```

    The leases are taken with tokens of their own through a second client on `client`'s
    connection pool, so aiolock treats them as another process's: code under test that
    takes the same lock, permit or side meanwhile finds it busy (`AcquireTimeoutError`,
    or a wait until the block ends). They are renewed while the block runs and released
    at its end (a lease lost meanwhile, for example by `expire_now`, is not an error here).

    What is held, by kind:

    - a `Lock`, or a lock's name: the lock; yields its `Lease`;
    - a `Semaphore`: `permits` permits, or every free one (the first waited for up to
      `timeout`, then as many as are free: the semaphore is then busy for everyone);
      yields a tuple of `Lease`s, each with its `slot`;
    - a `ReadWriteLock`'s `write()`: the writer (readers and writers are kept out); its
      `read()`: one reader (writers are kept out, readers still get in); yields its
      `Lease`;
    - a `Redlock`, with its list of clients as `client` (one per node, in its order): the
      lock on every node, or on the nodes `nodes` only (on a minority the code under test
      still gets its quorum; on a majority it does not); yields the `Lease` (a Redlock's
      over those nodes);
    - an `Election`: a leader elsewhere (identity "elsewhere"), whose term is renewed
      while the block runs and resigned at its end; yields its `Term`;
    - a `MultiLock`: every one of its names; yields the `MultiLease`.

    Args:
        client: the client the code under test uses (fakeredis's works too); for a
            `Redlock`, its list of clients.
        name: the lock's name, or the primitive (a `Lock`, a `Semaphore`, a read-write
            lock's side, a `Redlock`, an `Election`, a `MultiLock`); a primitive's own name
            and prefix are used.
        permits: a semaphore's permits to hold (1 to 10,000; default: every free one).
        nodes: a Redlock's nodes to hold it on, as indexes into `client` (each once, at
            least one; default: every node).
        ttl: the leases' ttl.
        timeout: how long to wait if it is already held; `AcquireTimeoutError` after.
        prefix: the lock's key prefix, with a name (a primitive has its own).

    Raises:
        TypeError: anything else than those kinds (a `ReadWriteLock` itself: pass its
            `read()` or `write()`), `permits` with anything but a `Semaphore`, `nodes`
            with anything but a `Redlock`, a `Redlock` without its list of clients, or a
            cluster client; before anything is sent to Redis.
        ConfigError: `permits`, `nodes`, `ttl`, `timeout` or `prefix` out of range, or a
            list of clients of another length than the Redlock's, before anything is sent
            to Redis.
        AcquireTimeoutError: it stayed held by someone else for `timeout`.

    Cancellation:
        Cancelled while taking it, nothing stays held (as the primitive's `acquire()`);
        the block's end releases what was taken under a shield, as `Lease.release()`.

    Added in 0.1.
    """
    target = _check_target(name, "name")
    if isinstance(target, Redlock | Election | MultiLock):
        if permits is not None:
            raise TypeError(f"permits applies to a Semaphore, not to {type(target).__name__}")
        return hold_other(client, target, nodes=nodes, ttl=ttl, timeout=timeout)
    if nodes is not None:
        raise TypeError(f"nodes applies to a Redlock, not to {type(target).__name__}")
    if permits is not None and not isinstance(target, Semaphore):
        raise TypeError(f"permits applies to a Semaphore, not to {type(target).__name__}")
    if permits is not None and (
        isinstance(permits, bool) or not isinstance(permits, int) or not 1 <= permits <= 10000
    ):
        raise ConfigError(
            f"permits must be a whole number from 1 to 10000, got {permits!r}",
            argument="permits",
            value=permits,
        )
    other = another_process(client)
    primitive: Lock | Semaphore | ReadLock | WriteLock
    if isinstance(target, str):
        primitive = Lock(other, target, ttl=ttl, timeout=timeout, prefix=prefix)
    elif isinstance(target, Lock):
        own = target._config.prefix
        primitive = Lock(other, target.name, ttl=ttl, timeout=timeout, prefix=own)
    elif isinstance(target, Semaphore):
        own = target._config.prefix
        primitive = Semaphore(
            other, target.name, limit=target.limit, ttl=ttl, timeout=timeout, prefix=own
        )
    else:
        own = target._config.prefix
        rw = ReadWriteLock(other, target.name, ttl=ttl, timeout=timeout, prefix=own)
        primitive = rw.read() if isinstance(target, ReadLock) else rw.write()
    return _held(other, primitive, permits)


@contextlib.asynccontextmanager
async def _held(
    other: AsyncRedis, primitive: Lock | Semaphore | ReadLock | WriteLock, permits: int | None
) -> AsyncIterator[Lease | tuple[Lease, ...]]:
    leases: list[Lease] = []
    try:
        leases.append(await primitive.acquire())
        if isinstance(primitive, Semaphore):
            while permits is None or len(leases) < permits:
                lease = await (primitive.try_acquire() if permits is None else primitive.acquire())
                if lease is None:  # every free permit is held
                    break
                leases.append(lease)
            yield tuple(leases)
        else:
            yield leases[0]
    finally:
        try:
            for lease in leases:
                with contextlib.suppress(LeaseLostError):
                    await lease.release()
        finally:
            await other.aclose()


@overload
async def expire_now(client: OneServer, lock: Semaphore, *, slot: int | None = None) -> bool: ...


@overload
async def expire_now(
    client: OneServer, lock: Lock | ReadLock | WriteLock | str, *, prefix: str = "aiolock"
) -> bool: ...


@overload
async def expire_now(
    client: Sequence[OneServer], lock: Redlock, *, nodes: Sequence[int] | None = None
) -> bool: ...


@overload
async def expire_now(client: OneServer, lock: Election | MultiLock) -> bool: ...


async def expire_now(
    client: OneServer | Sequence[OneServer],
    lock: Target,
    *,
    slot: int | None = None,
    nodes: Sequence[int] | None = None,
    prefix: str = "aiolock",
) -> bool:
    """Make leases expire now, as if their holders had stopped renewing them: each holder
    loses its lease at its next renewal (within a third of its ttl; at its `extend()` or
    release if it does not renew), which cancels the body of its `async with` and raises
    `LeaseLostError` there (`LossReason.NOT_OWNER`).

    ```python
    await expire_now(client, "orders:42")           # a lock's holder, by name
    await expire_now(client, lock)                  # a Lock's holder
    await expire_now(client, partner_api)           # every permit of a Semaphore
    await expire_now(client, partner_api, slot=2)   # the permit in slot 2
    await expire_now(client, catalog.write())       # a ReadWriteLock's writer
    await expire_now(client, catalog.read())        # every reader of it
    await expire_now([a, b, c], redlock)            # a Redlock's holder, on every node
    await expire_now([a, b, c], redlock, nodes=[0]) # on node 0 only (still a quorum)
    await expire_now(client, election)              # the current term
    await expire_now(client, accounts)              # a MultiLock's every name
    ```

    What expires, by kind:

    - a `Lock`, or a lock's name: its holder (the key is deleted, as an eviction or
      `aiolock release --force` would);
    - a `Semaphore`: every permit held, or with `slot`, the permit holding that slot (a
      lease's `slot`); permits handed over to a queued process and not claimed yet are
      left alone;
    - a `ReadWriteLock`'s `write()`: the writer; its `read()`: every reader;
    - a `Redlock`, with its list of clients as `client`: its holder on every node, or on
      the nodes `nodes` (evicted there token-guarded, as `Redlock.force_release` does: the
      node does not give the lease back at the next renewal); the holder loses the lease
      once fewer than a quorum renew it;
    - an `Election`: the current term (its state is deleted, as its expiry would: the
      leader loses the term at its next renewal and `leader()` names nobody until the
      next term);
    - a `MultiLock`: the holder of each name (the `MultiLease` is lost with its first).

    A permit or lease that expires this way is freed for the others as an expiry frees
    it (by the next command that reads the state); processes already waiting learn of it
    when the expired lease would have expired, at the latest.

    Args:
        client: the client the code under test uses (fakeredis's works too); for a
            `Redlock`, its list of clients (one per node, in its order).
        lock: the lock's name, or the primitive; a primitive's own prefix is used.
        slot: with a `Semaphore`, the slot of the one permit to expire (0 to 9999).
        nodes: with a `Redlock`, the nodes to expire it on, as indexes into `client`
            (each once, at least one; default: every node).
        prefix: the lock's key prefix, with a name.

    Returns:
        Whether anything was held (and now is not).

    Raises:
        TypeError: anything else than those kinds (a `ReadWriteLock` itself: pass its
            `read()` or `write()`), `slot` with anything but a `Semaphore`, `nodes` with
            anything but a `Redlock`, or a `Redlock` without its list of clients, before
            anything is sent to Redis.
        ConfigError: `slot`, `nodes` or `prefix` out of range, before anything is sent.
        BackendError: Redis could not be reached.

    Cancellation:
        Safe to cancel: what was sent expired what it reached; sending it again is safe.

    Added in 0.1.
    """
    target = _check_target(lock, "lock")
    if isinstance(target, Redlock | Election | MultiLock):
        if slot is not None:
            raise TypeError(f"slot applies to a Semaphore, not to {type(target).__name__}")
        return await expire_other(client, target, nodes=nodes)
    if nodes is not None:
        raise TypeError(f"nodes applies to a Redlock, not to {type(target).__name__}")
    checked = check_client(client)
    if slot is not None and not isinstance(target, Semaphore):
        raise TypeError(f"slot applies to a Semaphore, not to {type(target).__name__}")
    if slot is not None and (
        isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot <= _MAX_SLOT
    ):
        raise ConfigError(
            f"slot must be a whole number from 0 to {_MAX_SLOT}, got {slot!r}",
            argument="slot",
            value=slot,
        )
    if isinstance(target, Lock | str):
        key = (
            target.key
            if isinstance(target, Lock)
            else LockKeys.build(check_prefix(prefix), check_name(target)).lock
        )
        return bool(await checked.delete(key))
    if isinstance(target, Semaphore):
        which = "" if slot is None else str(slot)
        keys = [target.key, permits_key(target.key)]
    else:
        which = "0" if isinstance(target, ReadLock) else "1"
        keys = [target.lock.key]
    expired = await runtime_for(checked).backend.run(
        EXPIRE_LEASES,
        keys,
        [which],
        CallOptions(timeout=_TIMEOUT, operation="expire", name=target.name),
    )
    return int(expired) > 0
