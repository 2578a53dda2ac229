"""The synchronous primitives: `Lock`, `Semaphore`, `ReadWriteLock` (its `ReadLock` and
`WriteLock`) and `Redlock`, each a face on the asyncio primitive of the same name.

Each holds the asyncio primitive it stands for (made from the client's twin, `_transport.clients`),
with the same validation and messages, the same keys and scripts: a sync holder and an
asyncio holder of one name exclude each other and share one fencing sequence. Its calls
run on the portal's loop; its `with` blocks are tracked per thread, so that threads sharing
one object each hold a lease of their own and release their own.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar, Unpack, final

from .._engine.acquisition import UNSET, Busy, Primitive, Unset
from .._engine.lease import Lease as AsyncLease
from .._model.config import check_limit, check_timeout
from .._model.holder import LockInfo
from .._model.options import LockOptions
from .._model.weak_slot import WeakSlot
from .._primitives.lock import Lock as AsyncLock
from .._primitives.redlock import Redlock as AsyncRedlock
from .._primitives.redlock import RedlockInfo
from .._primitives.rwlock import ReadWriteInfo
from .._primitives.rwlock import ReadWriteLock as AsyncReadWriteLock
from .._primitives.semaphore import Semaphore as AsyncSemaphore
from .._primitives.semaphore import SemaphoreInfo
from ..errors import AcquireTimeoutError
from . import _portal
from ._clients import SyncClient, twin, twins
from ._lease import Lease, LossCallback

__all__ = ("Lock", "ReadLock", "ReadWriteLock", "Redlock", "Semaphore", "WriteLock")

P = TypeVar("P", bound=Primitive)
I = TypeVar("I", bound=Primitive | AsyncReadWriteLock)


class _Guards:
    """Which threads hold which name in a `with` block (through any object of that name on
    that client): a thread that would wait for a name it holds is refused, as a task is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[int, str], list[int]] = {}

    def holds(self, key: tuple[int, str]) -> bool:
        return threading.get_ident() in self._held.get(key, ())

    def enter(self, key: tuple[int, str]) -> None:
        with self._lock:
            self._held.setdefault(key, []).append(threading.get_ident())

    def leave(self, key: tuple[int, str]) -> None:
        with self._lock:
            threads = self._held.get(key, [])
            if threading.get_ident() in threads:
                threads.remove(threading.get_ident())
            if not threads:
                self._held.pop(key, None)

    def forked(self) -> None:
        """In a forked child: its only thread holds nothing (the blocks are the parent's)."""
        self.__init__()  # type: ignore[misc]


_GUARDS = _Guards()
_portal.on_fork(_GUARDS.forked)


def _check_on_lost(on_lost: object) -> LossCallback | None:
    if on_lost is not None and not callable(on_lost):
        raise TypeError(
            f"on_lost must be a function taking the LeaseLostError, or None, got "
            f"{type(on_lost).__name__}"
        )
    return on_lost


async def _give_back(lease: Lease) -> None:
    """On the loop: an acquisition interrupted after it was made is released."""
    await lease._async._cleanup_after_loss()


class _Base(Generic[I]):
    """The asyncio object a sync object stands for, and its calls through the portal."""

    __slots__ = ("__weakref__", "_inner", "_make", "_on_lost")

    def __init__(self, make: Callable[[], I], on_lost: object) -> None:
        self._make = make
        self._inner = (_portal.generation(), make())
        self._on_lost = _check_on_lost(on_lost)

    def _primitive(self) -> I:
        """The asyncio object (made again in a process forked since: the parent's is bound
        to the parent's loop and connections)."""
        made_in, inner = self._inner
        if made_in != _portal.generation():
            inner = self._make()
            self._inner = (_portal.generation(), inner)
            self._forked()
        return inner

    def _forked(self) -> None:
        """In a forked child, once: forget what was the parent's."""

    def _run(self, what: str, call: Callable[[I], Any]) -> Any:
        """`call(inner)` (a coroutine) run on the portal's loop."""
        _portal.check_caller(what)
        inner = self._primitive()
        return _portal.portal().run(lambda: call(inner))

    @property
    def name(self) -> str:
        return self._inner[1].name

    async def __aenter__(self) -> None:
        raise TypeError(
            f"aiolock.sync.{type(self).__name__} is for synchronous code ('with'); in async "
            f"code use aiolock.{type(self).__name__}"
        )

    async def __aexit__(self, *exc_info: object) -> None:  # pragma: no cover - aenter raises
        raise TypeError(f"use 'with' with aiolock.sync.{type(self).__name__}")


class _Face(_Base[P]):
    """What every sync primitive shares: acquisitions through the portal, `with` blocks
    per thread."""

    __slots__ = ("_blocks",)

    def __init__(self, make: Callable[[], P], on_lost: object) -> None:
        super().__init__(make, on_lost)
        self._blocks: dict[int, list[Lease]] = {}

    def _forked(self) -> None:
        self._blocks = {}

    @property
    def ttl(self) -> float:
        return self._inner[1].ttl

    @property
    def timeout(self) -> float | None:
        return self._inner[1].timeout

    # ----------------------------------------------------------------- acquiring
    def acquire(self, *, timeout: float | Unset | None = UNSET, token: str | None = None) -> Lease:
        """Wait for it and return the `Lease` (see the asyncio primitive's `acquire`).

        Args:
            timeout: seconds to wait; None waits forever, 0 tries once. Defaults to the
                primitive's `timeout`.
            token: the lease's token, chosen by the caller (as asyncio's `acquire`).

        Raises:
            AcquireTimeoutError: it stayed held by others for the whole timeout.
            BackendError: Redis could not be reached or refused the command.
            LeaseLostError: `token` was used for a lease that has ended.
            RuntimeError: the current thread holds it in a `with` block (through any object
                of this name and client) and `timeout` is not 0: waiting would never end;
                or the caller runs an event loop, or runs under gevent or eventlet.

        Interruption:
            Ctrl-C (or an exception raised by a signal handler, as Celery's time limits
            do) stops the acquisition on the background loop: nothing is left held or
            queued (an acquisition that had just succeeded is released) before the
            interruption propagates.
        """
        return self._acquire(lambda inner: inner.acquire(timeout=timeout, token=token), timeout)

    def _acquire(
        self, start: Callable[[P], Awaitable[AsyncLease]], timeout: float | Unset | None
    ) -> Lease:
        """`acquire`: the lease `start(inner)` acquires on the background loop, held for
        this thread (`timeout`: the caller's, for the reentry check)."""
        what = f"{type(self).__name__}.acquire()"
        _portal.check_caller(what)
        inner = self._primitive()
        wait = inner.timeout if isinstance(timeout, Unset) else check_timeout(timeout)
        key = (id(inner._client), inner._key)
        if wait != 0 and inner._guard_reentry and _GUARDS.holds(key):
            raise RuntimeError(
                f"{inner._what} {inner.name!r} is already held by this thread, in a 'with' "
                "block: waiting for it here would wait forever (it is not reentrant)"
            )
        on_lost = self._on_lost

        async def acquire() -> Lease:
            return Lease(await start(inner), on_lost=on_lost)

        return _portal.portal().run(acquire, undo=_give_back, label=inner.name)

    def try_acquire(self) -> Lease | None:
        """Try once, without waiting: the `Lease`, or None if someone else holds it.

        Raises:
            BackendError: Redis could not be reached or refused the command.

        Interruption:
            As for `acquire()`.
        """
        try:
            return self.acquire(timeout=0)
        except AcquireTimeoutError:
            return None

    def try_acquire_or_busy(self) -> Lease | Busy:
        """Try once: the `Lease`, or `Busy` saying who holds it and when to come back.

        Interruption:
            As for `acquire()`.
        """
        try:
            return self.acquire(timeout=0)
        except AcquireTimeoutError as busy:
            return Busy(name=self.name, holder=busy.holder, retry_after=busy.retry_after)

    def resume(self, token: str) -> Lease:
        """Take over the lease held under `token` (see the asyncio primitive's `resume`).

        Interruption:
            Stops the call; the lease's expiry is reset or not, it stays the holder's.
        """
        on_lost = self._on_lost

        async def resume(inner: P) -> Lease:
            return Lease(await inner.resume(token), on_lost=on_lost)

        return self._run(f"{type(self).__name__}.resume()", resume)  # type: ignore[no-any-return]

    def release_token(self, token: str) -> bool:
        """Release the lease held under `token` (see the asyncio primitive's
        `release_token`)."""
        result: bool = self._run(
            f"{type(self).__name__}.release_token()", lambda inner: inner.release_token(token)
        )
        return result

    # ----------------------------------------------------------------- with lock:
    def __enter__(self) -> Lease:
        """Acquire (waiting up to the `timeout`) and hold the lease for the block: this
        thread's, released by this thread's exit of the block."""
        lease = self.acquire()
        inner = self._primitive()
        self._blocks.setdefault(threading.get_ident(), []).append(lease)
        _GUARDS.enter((id(inner._client), inner._key))
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release this thread's lease; see `Lease.exit_block` for what is raised."""
        ident = threading.get_ident()
        stack = self._blocks.get(ident)
        if not stack:
            raise RuntimeError(f"{self.name!r} is not held by the current thread")
        lease = stack.pop()
        if not stack:
            self._blocks.pop(ident, None)
        inner = self._inner[1]
        _GUARDS.leave((id(inner._client), inner._key))
        lease.exit_block(exc)

    def __repr__(self) -> str:
        held = sum(len(stack) for stack in list(self._blocks.values()))
        return (
            f"<aiolock.sync.{type(self).__name__} {self.name!r} ttl={self.ttl:g}s held_here={held}>"
        )


@final
class Lock(_Face[AsyncLock]):
    """A named lock in Redis for synchronous code (threads, Celery tasks, Django views and
    commands, scripts): one holder at a time, across processes and across asyncio code
    using `aiolock.Lock` with the same name.

    ```python
    with Lock(redis.Redis(), "orders:42", ttl=10) as lease:
        db.write(..., fence=lease.fencing_token)
    ```

    While held, the lease is renewed by aiolock.sync's background event loop (one thread
    per process for every lease). A synchronous body cannot be cancelled: it learns of a
    loss from `lease.lost`, `lease.check()` (which raises `LeaseLostError`), the `on_lost`
    callback, and at the block's exit, which raises `LeaseLostError`.

    One object may be shared by threads: each `with` is its own lease, released by the
    thread that entered it.

    Args:
        client: a synchronous client: `redis.Redis` (also `redis.from_url(...)`), a
            `Sentinel(...).master_for(...)` client, a `redis.RedisCluster`, or valkey-py's
            `valkey.Valkey` or `ValkeyCluster`; or a URL (`redis://`, `rediss://`,
            `unix://`). aiolock makes an asyncio client with its connection settings for
            the background loop (see the documentation's Synchronous code).
        name: the lock's name, as `aiolock.Lock`'s.
        on_lost: called with the `LeaseLostError` when a lease of this lock is lost, on the
            background loop's thread: keep it short (set an event, signal your thread);
            while it runs, no lease of the process is renewed. It must not call aiolock.sync
            (that raises `RuntimeError`).
        options: `LockOptions`, as for `aiolock.Lock`.

    Raises:
        TypeError: a wrong type (an asyncio client, a `bytes` name, ...) or an unknown
            keyword.
        ConfigError: a value out of range; the message names the argument and the range.

    Added in 0.1.
    """

    __slots__ = ()

    def __init__(
        self,
        client: SyncClient,
        name: str,
        *,
        on_lost: LossCallback | None = None,
        **options: Unpack[LockOptions],
    ) -> None:
        super().__init__(lambda: AsyncLock(twin(client), name, **options), on_lost)

    @property
    def key(self) -> str:
        """The Redis key that exists while the lock is held."""
        return self._inner[1].key

    def locked(self) -> bool:
        """Whether anyone holds the lock right now (one round trip)."""
        result: bool = self._run("Lock.locked()", lambda inner: inner.locked())
        return result

    def info(self) -> LockInfo | None:
        """The current holder as recorded in Redis, or None if free (one round trip)."""
        result: LockInfo | None = self._run("Lock.info()", lambda inner: inner.info())
        return result

    def force_release(self) -> LockInfo | None:
        """Evict the current holder (token-guarded), as asyncio's `Lock.force_release`."""
        result: LockInfo | None = self._run(
            "Lock.force_release()", lambda inner: inner.force_release()
        )
        return result


@final
class Semaphore(_Face[AsyncSemaphore]):
    """At most `limit` holders at once, across processes (and asyncio code using
    `aiolock.Semaphore` with the same name), for synchronous code. Each permit is a
    `Lease`, as a `Lock`'s.

    Args:
        client: as for `Lock`.
        name: the semaphore's name.
        limit: permits held at once at most (1 to 10,000), if no other limit is stored.
        on_lost: as for `Lock`.
        options: `LockOptions`, as for `aiolock.Semaphore`.

    Added in 0.1.
    """

    __slots__ = ()

    def __init__(
        self,
        client: SyncClient,
        name: str,
        *,
        limit: int,
        on_lost: LossCallback | None = None,
        **options: Unpack[LockOptions],
    ) -> None:
        super().__init__(
            lambda: AsyncSemaphore(twin(client), name, limit=limit, **options), on_lost
        )

    def acquire(
        self,
        *,
        permits: int = 1,
        timeout: float | Unset | None = UNSET,
        token: str | None = None,
    ) -> Lease:
        """Wait for `permits` permits and return them as one `Lease` (`lease.permits`),
        taken all at once or not at all (see asyncio's `Semaphore.acquire`).

        Args:
            permits: permits to hold, from 1 to the limit in force (at most 10,000).
            timeout: as for `Lock.acquire`.
            token: as for `Lock.acquire`.

        Raises:
            ConfigError: `permits` out of range (nothing sent), or above the limit in
                force (nothing held).
            AcquireTimeoutError, BackendError, LeaseLostError, RuntimeError: as for
                `Lock.acquire`.

        Interruption:
            As for `Lock.acquire`.
        """
        permits = check_limit(permits, argument="permits")
        return self._acquire(
            lambda inner: inner.acquire(permits=permits, timeout=timeout, token=token), timeout
        )

    def try_acquire(self, *, permits: int = 1) -> Lease | None:
        """Try once, without waiting: a `Lease` of `permits` permits, or None if fewer are
        free.

        Raises:
            ConfigError: `permits` out of range (see `acquire`).
            BackendError: Redis could not be reached or refused the command.
        """
        try:
            return self.acquire(permits=permits, timeout=0)
        except AcquireTimeoutError:
            return None

    @property
    def limit(self) -> int:
        """The limit this object stores when the semaphore is not in use."""
        return self._inner[1].limit

    @property
    def key(self) -> str:
        return self._inner[1].key

    def set_limit(self, limit: int) -> int | None:
        """Change the limit in force; the limit that was in force (see asyncio's)."""
        result: int | None = self._run(
            "Semaphore.set_limit()", lambda inner: inner.set_limit(limit)
        )
        return result

    def info(self) -> SemaphoreInfo:
        """The limit in force, the permits held and the tasks waiting (one round trip)."""
        result: SemaphoreInfo = self._run("Semaphore.info()", lambda inner: inner.info())
        return result

    def locked(self) -> bool:
        """Whether no permit is free right now (one round trip)."""
        result: bool = self._run("Semaphore.locked()", lambda inner: inner.locked())
        return result


class _Side(_Face[Primitive]):
    """One side of a sync `ReadWriteLock`."""

    __slots__ = ("_rw",)

    def __init__(self, rw: ReadWriteLock, pick: Callable[[AsyncReadWriteLock], Primitive]) -> None:
        self._rw = rw
        super().__init__(lambda: pick(rw._primitive()), rw._on_lost)

    @property
    def lock(self) -> ReadWriteLock:
        """The read-write lock this is a side of."""
        return self._rw


@final
class ReadLock(_Side):
    """The read side of a sync `ReadWriteLock` (`rw.read()`): shared with other readers.

    Added in 0.1.
    """

    __slots__ = ()


@final
class WriteLock(_Side):
    """The write side of a sync `ReadWriteLock` (`rw.write()`): alone.

    Added in 0.1.
    """

    __slots__ = ()


def _read_side(rw: AsyncReadWriteLock) -> Primitive:
    return rw.read()


def _write_side(rw: AsyncReadWriteLock) -> Primitive:
    return rw.write()


@final
class ReadWriteLock(_Base[AsyncReadWriteLock]):
    """Many readers or one writer, writers first, across processes (and asyncio code using
    `aiolock.ReadWriteLock` with the same name), for synchronous code.

    ```python
    catalog = ReadWriteLock(redis.Redis(), "catalog", ttl=30)
    with catalog.read():
        items = load()
    with catalog.write() as lease:
        save(..., fence=lease.fencing_token)
    ```

    Args:
        client: as for `Lock`.
        name: the lock's name.
        on_lost: as for `Lock`, for the leases of either side.
        options: `LockOptions`, as for `aiolock.ReadWriteLock`.

    Added in 0.1.
    """

    __slots__ = ("_read", "_write")

    def __init__(
        self,
        client: SyncClient,
        name: str,
        *,
        on_lost: LossCallback | None = None,
        **options: Unpack[LockOptions],
    ) -> None:
        super().__init__(lambda: AsyncReadWriteLock(twin(client), name, **options), on_lost)
        # Referred to weakly, as `aiolock.ReadWriteLock` does its sides: each refers to
        # this lock.
        self._read: WeakSlot[ReadLock] = WeakSlot()
        self._write: WeakSlot[WriteLock] = WeakSlot()

    def read(self) -> ReadLock:
        """The read side (the same object each time, while it is in use)."""
        return self._read.get(lambda rw: ReadLock(rw, _read_side), self)

    def write(self) -> WriteLock:
        """The write side (the same object each time, while it is in use)."""
        return self._write.get(lambda rw: WriteLock(rw, _write_side), self)

    @property
    def key(self) -> str:
        return self._inner[1].key

    def info(self) -> ReadWriteInfo:
        """The readers, the writer and who waits (one round trip)."""
        result: ReadWriteInfo = self._run("ReadWriteLock.info()", lambda inner: inner.info())
        return result

    def locked(self) -> bool:
        """Whether it is held right now on either side (one round trip)."""
        result: bool = self._run("ReadWriteLock.locked()", lambda inner: inner.locked())
        return result

    def __enter__(self) -> None:
        raise TypeError("use 'with rw.read()' or 'with rw.write()' with a ReadWriteLock")

    def __exit__(self, *exc_info: object) -> None:  # pragma: no cover - __enter__ raises
        raise TypeError("use 'with rw.read()' or 'with rw.write()' with a ReadWriteLock")

    def __repr__(self) -> str:
        return f"<aiolock.sync.ReadWriteLock {self.name!r}>"


@final
class Redlock(_Face[AsyncRedlock]):
    """A lock held on a quorum of N independent Redis servers, for synchronous code (see
    `aiolock.Redlock`, whose keys, scripts and fencing tokens it shares).

    Args:
        clients: synchronous clients of independent servers (a list or tuple), or URLs.
        name: the lock's name.
        node_timeout: seconds each node's call may take; default a tenth of the ttl.
        drift: seconds subtracted from a lease's validity for clock drift.
        on_lost: as for `Lock`.
        options: `LockOptions`, as for `aiolock.Redlock`.

    Added in 0.1.
    """

    __slots__ = ()

    def __init__(
        self,
        clients: Sequence[SyncClient],
        name: str,
        *,
        node_timeout: float | None = None,
        drift: float | None = None,
        on_lost: LossCallback | None = None,
        **options: Unpack[LockOptions],
    ) -> None:
        def make() -> AsyncRedlock:
            return AsyncRedlock(
                twins(clients), name, node_timeout=node_timeout, drift=drift, **options
            )

        super().__init__(make, on_lost)

    @property
    def key(self) -> str:
        return self._inner[1].key

    @property
    def quorum(self) -> int:
        return self._inner[1].quorum

    def locked(self) -> bool:
        """Whether a quorum holds it right now."""
        result: bool = self._run("Redlock.locked()", lambda inner: inner.locked())
        return result

    def info(self) -> RedlockInfo | None:
        """Each node's holder and the quorum's (see asyncio's `Redlock.info`)."""
        result: RedlockInfo | None = self._run("Redlock.info()", lambda inner: inner.info())
        return result

    def force_release(self) -> LockInfo | None:
        """Evict the holder on every node that holds it (token-guarded)."""
        result: LockInfo | None = self._run(
            "Redlock.force_release()", lambda inner: inner.force_release()
        )
        return result
