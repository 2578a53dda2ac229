"""Locks made busy or lost on purpose, for tests of code that uses aiolock."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import redis.asyncio

from .._layout import LockKeys
from .._lease import Lease
from .._lock import Lock
from ..errors import LeaseLostError

__all__ = ("expire_now", "hold_elsewhere")


@contextlib.asynccontextmanager
async def hold_elsewhere(
    client: redis.asyncio.Redis,
    name: str,
    *,
    ttl: float = 30.0,
    timeout: float | None = 5.0,
    prefix: str = "aiolock",
) -> AsyncIterator[Lease]:
    """Hold the lock `name` for the duration of the block, as another process would.

    The lease is taken with a token of its own through a second client on `client`'s
    connection pool, so aiolock treats it as another process's: code under test that locks
    `name` meanwhile finds it busy (`AcquireTimeoutError`, or a wait until the block ends).
    It is renewed while the block runs and released at its end (a lease lost meanwhile, for
    example by `expire_now`, is not an error here).

    Args:
        client: the client the code under test uses (fakeredis's works too).
        name: the lock's name, as given to `Lock`.
        ttl: the lease's ttl.
        timeout: how long to wait if the lock is already held; `AcquireTimeoutError` after.
        prefix: the lock's key prefix, as given to `Lock`.
    """
    other = redis.asyncio.Redis(connection_pool=client.connection_pool)
    try:
        lease = await Lock(other, name, ttl=ttl, prefix=prefix).acquire(timeout=timeout)
        try:
            yield lease
        finally:
            with contextlib.suppress(LeaseLostError):
                await lease.release()
    finally:
        await other.aclose()


async def expire_now(
    client: redis.asyncio.Redis, lock: Lock | str, *, prefix: str = "aiolock"
) -> bool:
    """Delete the holder's key of `lock` (a `Lock`, or a lock's name), as an expiry, an
    eviction or `aiolock release --force` would: the holder's lease is lost at its next
    renewal (within a third of its ttl; at its `extend()` or release if it does not renew),
    which cancels the body of its `async with` and raises `LeaseLostError` there.

    Returns whether the lock was held.
    """
    key = lock.key if isinstance(lock, Lock) else LockKeys.build(prefix, lock).lock
    return bool(await client.delete(key))
