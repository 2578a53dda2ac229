"""`MultiLock`: several lock names held as one, all or none.

Composed from `Lock`s, as Redisson's MultiLock is: each name is a lock of its own on the
engine (its FIFO queue, its lease, its renewal in the watchdog's batches), acquired one
after the other in one canonical order (sorted), so two holders listing the same names in
different orders never wait for each other in a circle. `MultiLease` holds the leases as
one: a loss of any cancels the body (one cancel scope, told by each lease when it ends),
and they are released together, concurrently. An acquire that fails or is cancelled gives
back what it took, under a shield, before it raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any, Final, Unpack, final

import anyio

from .._aio.shielding import run_shielded
from .._aio.task_blocks import Blocks
from .._engine.acquisition import UNSET, Unset
from .._engine.guard import BodyGuard
from .._engine.lease import RELEASE_TIMEOUT, Lease
from .._model.config import check_names, check_timeout
from .._model.options import LockOptions, lock_config
from .._transport.clients import AsyncClient, check_client
from ..errors import AcquireTimeoutError, AiolockError, BackendError, LeaseLostError, LossReason
from .lock import Lock

__all__ = ("MultiLease", "MultiLock")

logger = logging.getLogger("aiolock")

GIVE_BACK_TIMEOUT: Final = RELEASE_TIMEOUT + 0.5
"""Longest wait for the leases of a failed acquire to be given back."""


async def _release_quietly(lease: Lease) -> BaseException | None:
    """Release `lease`; what it raised (an aiolock error or a timeout), else None."""
    try:
        await lease.release()
    except (AiolockError, TimeoutError) as error:
        return error
    return None


async def _release_all(leases: Sequence[Lease]) -> list[BaseException | None]:
    """Release every lease at once (each finishes even if the caller is cancelled); what
    each release raised. Past GIVE_BACK_TIMEOUT altogether (a process paused in the middle
    of them), those not done are stopped: each is a `BackendError` (the key expires by
    itself), and such a lease can be released again."""
    if not leases:
        return []
    try:
        return list(await run_shielded(_gathered(leases), timeout=GIVE_BACK_TIMEOUT))
    except TimeoutError as exc:
        failed = BackendError(
            f"release of {len(leases)} leases did not finish within {GIVE_BACK_TIMEOUT:g}s",
            operation="release",
        )
        failed.__cause__ = exc
        return [
            lease.loss_error() if lease.lost else None if lease.released else failed
            for lease in leases
        ]


async def _gathered(leases: Sequence[Lease]) -> list[BaseException | None]:
    return list(await asyncio.gather(*(_release_quietly(lease) for lease in leases)))


def _lease_ended(ref: weakref.ref[MultiLease], lease: Lease) -> None:
    held = ref()
    if held is not None:
        held._lease_ended(lease)


@final
class MultiLease:
    """Several locks' leases held as one: from `MultiLock.acquire()` or `async with
    multilock as held`.

    Used as an async context manager (as `async with multilock` does), the body is
    cancelled as soon as any of the leases is lost, and `LeaseLostError` (naming the lost
    lock) is raised at the end of the block; every lease is released when it ends.

    Attributes:
        names: the locks' names, in the order they were taken (sorted).
        leases: each name's `Lease`.

    Added in 0.1.
    """

    __slots__ = (
        "__weakref__",
        "_ended",
        "_first_loss",
        "_guard",
        "_locks",
        "_scope",
        "_task",
        "leases",
        "names",
    )

    def __init__(self, locks: Sequence[Lock], leases: Sequence[Lease]) -> None:
        self._locks = tuple(locks)
        self.names = tuple(lock.name for lock in locks)
        self.leases: Mapping[str, Lease] = MappingProxyType(
            dict(zip(self.names, leases, strict=True))
        )
        self._scope: anyio.CancelScope | None = None
        self._task: asyncio.Task[Any] | None = None
        self._guard: BodyGuard | None = None
        self._first_loss: Lease | None = None
        self._ended: asyncio.Event | None = None
        ref = weakref.ref(self)  # a lease must not keep its MultiLease (nor so itself) alive
        for lease in leases:
            lease._when_ended(functools.partial(_lease_ended, ref))

    def _lease_ended(self, lease: Lease) -> None:
        if lease.lost and self._first_loss is None:
            self._first_loss = lease
            if self._scope is not None:
                self._scope.cancel()
                if self._guard is not None:
                    self._guard.lost()
        if self._ended is not None and (
            self.lost or all(other.released for other in self.leases.values())
        ):
            self._ended.set()

    def _check_deadlines(self) -> None:
        for lease in self.leases.values():
            lease._check_deadline(settle=True)

    @property
    def fencing_tokens(self) -> Mapping[str, int]:
        """Each name's fencing token, for storage that checks them."""
        return {name: lease.fencing_token for name, lease in self.leases.items()}

    @property
    def held(self) -> bool:
        """True while every lease is held (see `Lease.held`)."""
        return all(lease.held for lease in self.leases.values())

    @property
    def lost(self) -> bool:
        """True once any lease was lost; never goes back to False."""
        return any(lease.lost for lease in self.leases.values())

    @property
    def loss_reason(self) -> LossReason | None:
        """Why the first lease lost was lost, or None."""
        lost = self._lost_lease()
        return None if lost is None else lost.loss_reason

    def remaining(self) -> float:
        """Seconds of validity left to the lease that has the least."""
        return min(lease.remaining() for lease in self.leases.values())

    def __repr__(self) -> str:
        state = "held" if self.held else "lost" if self.lost else "released"
        return f"<MultiLease {list(self.names)!r} {state}>"

    def _lost_lease(self) -> Lease | None:
        if self._first_loss is not None:
            return self._first_loss
        return next((lease for lease in self.leases.values() if lease.lost), None)

    async def wait_lost(self) -> LeaseLostError | None:
        """Wait until a lease is lost (its error) or every lease is released (None).

        Cancellation:
            Safe to cancel; nothing is changed.
        """
        if self._ended is None:
            self._ended = asyncio.Event()
        if not self.lost and not all(lease.released for lease in self.leases.values()):
            await self._ended.wait()
        lost = self._lost_lease()
        return None if lost is None else lost.loss_error()

    async def extend(self, ttl: float | None = None) -> None:
        """Reset every lease's expiry (see `Lease.extend`), all at once.

        Raises:
            LeaseLostError: a lease was lost (the first, in name order).
            BackendError: Redis did not answer in time.

        Cancellation:
            Safe to cancel, as `Lease.extend`.
        """
        results = await asyncio.gather(
            *(lease.extend(ttl) for lease in self.leases.values()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def release(self) -> None:
        """Release every lease, all at once. Calling it again does nothing.

        Raises:
            LeaseLostError: a lease had been lost (the first, in name order): what was done
                since was not protected by it. The others are released all the same.
            BackendError: Redis could not be reached for some lease (it expires by itself).

        Cancellation:
            Every release runs to completion (for up to a few seconds) even if the caller is
            cancelled meanwhile; the cancellation is re-raised afterwards.
        """
        errors = await _release_all(list(self.leases.values()))
        lost = [error for error in errors if isinstance(error, LeaseLostError)]
        if lost:
            raise lost[0]
        for error in errors:
            if error is not None:
                raise error

    # ----------------------------------------------------------------- context manager
    def __enter__(self) -> None:
        raise TypeError("use 'async with' with a MultiLease, not 'with'")

    def __exit__(self, *exc_info: object) -> None:  # pragma: no cover - __enter__ raises
        raise TypeError("use 'async with' with a MultiLease, not 'with'")

    async def __aenter__(self) -> MultiLease:
        """Guard the body: it is cancelled if any lease is lost while it runs.

        Raises:
            LeaseLostError: a lease was lost already (every lease is then released).
        """
        if self._scope is not None:
            raise RuntimeError("this MultiLease is already guarding a block")
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - asyncio always runs coroutines in a task
            raise RuntimeError("a MultiLease must guard a block of an asyncio task")
        if self.lost:
            lost = self._lost_lease()
            await _release_all(list(self.leases.values()))
            assert lost is not None
            raise lost.loss_error()
        scope = anyio.CancelScope()
        scope.__enter__()
        self._scope = scope
        self._task = task
        self._guard = BodyGuard(task, scope, self._check_deadlines)
        for lock, lease in zip(self._locks, self.leases.values(), strict=True):
            lock._guarding(lease, task, entered=True)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release every lease, and say whether the body ran protected throughout.

        Raises:
            LeaseLostError: a lease was lost while the body ran (the body was cancelled), or
                the body finished after a lease was gone. The body's own exception
                propagates unchanged, with a note if a lease was also lost. A release that
                fails because Redis cannot be reached is logged, not raised.

        Cancellation:
            Only the cancellation caused by a loss is turned into `LeaseLostError`; any other
            cancellation propagates untouched, after the releases.
        """
        scope, self._scope = self._scope, None
        assert scope is not None, "__aexit__ without __aenter__"
        task, self._task = self._task, None
        if self._guard is not None:
            self._guard.close()  # before the scope's exit: it takes back its own cancels
            self._guard = None
        if task is not None:
            for lock, lease in zip(self._locks, self.leases.values(), strict=True):
                lock._guarding(lease, task, entered=False)
        swallowed = bool(scope.__exit__(exc_type, exc, tb))
        errors = await _release_all(list(self.leases.values()))
        lost = self._lost_lease()
        if lost is not None:
            if swallowed or exc is None:
                raise lost.loss_error(body_completed=not swallowed)
            if not isinstance(exc, asyncio.CancelledError):
                exc.add_note(
                    f"aiolock: the lease on lock {lost.name!r} was also lost while this "
                    f"exception was raised ({lost.loss_error()})"
                )
            return
        for error in errors:
            if error is not None:
                logger.warning(
                    "aiolock: could not release a lock (it expires by itself): %s", error
                )


@final
class MultiLock:
    """Several lock names held at once, all or none: Redisson's MultiLock, node-redlock's
    multiple resources.

    ```python
    async with MultiLock(redis, ["account:1", "account:2"], ttl=10) as held:
        await transfer(fences=held.fencing_tokens)
    ```

    The names are taken one after the other in one canonical order (sorted), whatever order
    they were given in: two tasks or processes locking {A, B} and {B, A} never deadlock.
    Each name is a `Lock` (its own FIFO queue, lease and fencing token), renewed in the
    watchdog's batches with every other lease of the client. If any name cannot be had
    within the `timeout` (which covers the whole acquisition), or the acquire fails or is
    cancelled, the names already taken are released at once: nothing stays held or queued.
    On Redis Cluster the names may live in different slots (one call per name, each to its
    slot, in order).

    Args:
        client: a redis-py or valkey-py asyncio client, of one server or of a cluster, as
            for `Lock`.
        names: the locks' names (1 to 1000; each as a `Lock`'s name). Duplicates are
            merged: a name listed twice is held once.
        options: the settings of every name's lock, `LockOptions`, as for `Lock`: `ttl`,
            `renew`, `renew_interval`, `timeout`, `max_hold`, `prefix`, `retain`,
            `hold_stats`, `replicas`, `replica_timeout`. The `timeout` covers all the
            names together (0 tries each once).

    Raises:
        TypeError: a wrong type (`names` a single `str`, say).
        ConfigError: a value out of range; the message names the argument and the range.

    Added in 0.1.
    """

    __slots__ = ("_held", "_locks", "_timeout")

    def __init__(
        self,
        client: AsyncClient,
        names: Iterable[str],
        **options: Unpack[LockOptions],
    ) -> None:
        checked_client = check_client(client)
        ordered = check_names(names)
        config = lock_config("MultiLock()", options)
        each: LockOptions = {**options, "timeout": None}  # the MultiLock keeps the timeout
        self._timeout = config.timeout
        self._locks = tuple(Lock(checked_client, name, **each) for name in ordered)
        self._held: Blocks[MultiLease] = Blocks()

    @property
    def names(self) -> tuple[str, ...]:
        """The names, in the order they are taken (sorted, duplicates merged)."""
        return tuple(lock.name for lock in self._locks)

    @property
    def locks(self) -> tuple[Lock, ...]:
        """One `Lock` per name, in that order."""
        return self._locks

    @property
    def timeout(self) -> float | None:
        return self._timeout

    def __repr__(self) -> str:
        return f"<MultiLock {list(self.names)!r} held_here={len(self._held)}>"

    async def acquire(self, *, timeout: float | Unset | None = UNSET) -> MultiLease:
        """Take every name, in order, and return them as one `MultiLease`.

        Args:
            timeout: seconds to wait for all the names together; None waits forever, 0
                tries each once. Defaults to the multi-lock's `timeout`.

        Raises:
            AcquireTimeoutError: a name stayed held by others until the timeout ran out
                (`name` says which; `timeout` and `waited` are the whole acquisition's).
                The names taken before it were released first.
            BackendError: Redis could not be reached or refused a command (the names taken
                were released first, or expire by themselves if Redis cannot be reached).
            LeaseLostError: a name taken first was lost while a later one was waited for
                (every name was released).
            RuntimeError: the current task holds one of the names in an `async with` block
                (waiting for it would wait forever), unless `timeout` is 0.

        Cancellation:
            A cancelled acquire leaves nothing held and nothing queued: the name being
            waited for is withdrawn (as `Lock.acquire()` does), and the names taken before
            it are released under a shield, all at once, before the cancellation propagates.
        """
        wait = self._timeout if isinstance(timeout, Unset) else check_timeout(timeout)
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = None if wait is None else started + wait
        leases: list[Lease] = []
        try:
            for lock in self._locks:
                left = None if deadline is None else max(deadline - loop.time(), 0.0)
                leases.append(await lock.acquire(timeout=left))
            lost = next((lease for lease in leases if lease.lost), None)
            if lost is not None:
                raise lost.loss_error()
        except AcquireTimeoutError as busy:
            await _release_all(leases)
            waited = loop.time() - started
            raise AcquireTimeoutError(
                f"lock {busy.name!r} of {len(self._locks)} names not acquired within "
                f"{wait or 0:g}s (waited {waited:.3g}s for all; the names taken before it "
                "were released)",
                name=busy.name,
                timeout=wait or 0.0,
                waited=waited,
                attempts=busy.attempts,
                holder=busy.holder,
                retry_after=busy.retry_after,
            ) from busy
        except BaseException:
            await _release_all(leases)
            raise
        return MultiLease(self._locks, leases)

    async def try_acquire(self) -> MultiLease | None:
        """Try each name once, without waiting: the `MultiLease`, or None if any is held by
        someone else (the names taken are released first).

        Raises:
            BackendError: Redis could not be reached or refused a command.

        Cancellation:
            As for `acquire()`.
        """
        try:
            return await self.acquire(timeout=0)
        except AcquireTimeoutError:
            return None

    # ----------------------------------------------------------------- async with
    def __enter__(self) -> None:
        raise TypeError("use 'async with' with a MultiLock, not 'with'")

    def __exit__(self, *exc_info: object) -> None:  # pragma: no cover - __enter__ raises
        raise TypeError("use 'async with' with a MultiLock, not 'with'")

    async def __aenter__(self) -> MultiLease:
        """Acquire every name (waiting up to the `timeout`) and guard the body.

        Cancellation:
            As for `acquire()`.
        """
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - asyncio always runs coroutines in a task
            raise RuntimeError("MultiLock must be used from an asyncio task")
        held = await self.acquire()
        try:
            await held.__aenter__()
        except BaseException:
            with contextlib.suppress(AiolockError, TimeoutError):
                await held.release()
            raise
        self._held.entered(task, held)
        return held

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the current task's leases; see `MultiLease.__aexit__`."""
        await self._held.exit(
            exc_type, exc, tb, not_held="this MultiLock is not held by the current task"
        )
