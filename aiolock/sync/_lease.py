"""`Lease` for synchronous code: one acquisition, held by the portal's loop, read from any
thread.

The asyncio `Lease` it wraps lives on the portal's loop: the watchdog renews it there, its
deadline timer runs there, and its end (released or lost) is told here by a callback on
that loop (`_ended`), which also calls the user's `on_lost`. What a thread reads (`held`,
`lost`, `check()`) is the state that callback wrote and the deadline, compared with the
clock (the loop's, `time.monotonic()`): no call to the loop, except past the deadline,
where the loop first reads a renewal's reply that may have arrived (as asyncio's `lost`
does).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import os
import warnings
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Final, final

from .._engine.lease import Lease as AsyncLease
from ..errors import AiolockError, LeaseLostError, LossReason
from . import _portal

__all__ = ("Lease", "LossCallback", "dropped", "held_leases")

logger = logging.getLogger("aiolock")

LossCallback = Callable[[LeaseLostError], object]
"""`on_lost(error)`: called on aiolock.sync's loop thread when a lease is lost."""

_SETTLE_TRIES: Final = 10


class _State(enum.Enum):
    HELD = "held"
    RELEASED = "released"
    LOST = "lost"
    REVOKED = "released by release_all"


_HELD: weakref.WeakSet[Lease] = weakref.WeakSet()
"""The sync leases held in this process (added and removed on the portal's loop)."""
_dropping: set[asyncio.Task[None]] = set()


def held_leases() -> list[Lease]:
    """The sync leases held now (read on the portal's loop)."""
    return list(_HELD)


def dropped() -> list[asyncio.Task[None]]:
    """The releases of leases garbage-collected while held, still running (on the loop)."""
    return list(_dropping)


def _forked() -> None:
    """In a forked child: the leases held are the parent's, not this process's to release."""
    _HELD.clear()


_portal.on_fork(_forked)


def _ended(ref: weakref.ref[Lease], lease: AsyncLease) -> None:
    """On the loop: the asyncio lease ended (released or lost)."""
    mine = ref()
    if mine is None:
        return
    _HELD.discard(mine)
    if mine._state is not _State.HELD:
        return  # revoked by release_all: told already
    if not lease.lost:
        mine._state = _State.RELEASED
        return
    error = lease.loss_error()
    mine._error = error
    mine._state = _State.LOST
    callback = mine._on_lost
    if callback is not None:
        try:
            callback(error)
        except Exception:
            logger.exception("aiolock: the on_lost callback of lease %r failed", mine)


async def _settle(lease: AsyncLease) -> bool:
    """On the loop: past the deadline, read a renewal's reply that may have arrived, then
    say whether the lease is lost."""
    for _ in range(_SETTLE_TRIES):
        await lease._settle_deadline()
        if not lease._settling:
            break
        await asyncio.sleep(0)
    return lease.lost


async def _release_dropped(lease: AsyncLease) -> None:
    with contextlib.suppress(AiolockError, TimeoutError):
        await lease.release()


@final
class Lease:
    """One acquisition of a lock (a semaphore's permit, a read-write lock's side), for
    synchronous code: held until released, or lost.

    Obtained from `acquire()`, `try_acquire()` or `with lock as lease` of the primitives of
    `aiolock.sync`; not created directly. While held, aiolock.sync's background event loop
    renews it (the same watchdog as asyncio code's).

    A synchronous body cannot be cancelled: it learns of a loss from `lost`, from
    `check()` (which raises `LeaseLostError`), from the `on_lost` callback of its lock, and
    at the block's exit, which raises `LeaseLostError` when the lease was lost meanwhile.
    Check it before a write that must not happen unprotected, and fence the write with
    `fencing_token`.

    Attributes:
        name: the lock's name.
        token: the secret that proves ownership in Redis (never shown whole).
        fencing_token: strictly greater than that of every earlier lease of this name, the
            same sequence as asyncio code's leases of the name.
        slot: a semaphore permit's slot (the first, for several permits), else None.
        permits: n for `Semaphore.acquire(permits=n)`, else 1.

    Added in 0.1.
    """

    __slots__ = (
        "__weakref__",
        "_async",
        "_error",
        "_generation",
        "_loop",
        "_on_lost",
        "_pid",
        "_state",
        "fencing_token",
        "name",
        "permits",
        "slot",
        "token",
    )

    def __init__(self, lease: AsyncLease, *, on_lost: LossCallback | None) -> None:
        """Made on the portal's loop, right after the acquisition."""
        self._async = lease
        self._loop = lease._loop
        self.name = lease.name
        self.token = lease.token
        self.fencing_token = lease.fencing_token
        self.slot = lease.slot
        self.permits = lease.permits
        self._on_lost = on_lost
        self._state = _State.HELD
        self._error: LeaseLostError | None = None
        self._generation = _portal.generation()
        self._pid = os.getpid()
        _HELD.add(self)
        lease._when_ended(functools.partial(_ended, weakref.ref(self)))

    # ----------------------------------------------------------------- state, read-only
    @property
    def deadline(self) -> float:
        """`time.monotonic()` until which the lease is valid for sure (moves forward with
        each confirmed renewal)."""
        return self._async.deadline

    def remaining(self) -> float:
        """Seconds of validity left; 0.0 once released or lost, or past the deadline."""
        if not self._here() or self._state is not _State.HELD:
            return 0.0
        return max(0.0, self._async.deadline - self._loop.time())

    def held_for(self) -> float:
        """Seconds since the lease was granted."""
        return self._async.held_for()

    @property
    def held(self) -> bool:
        """True while neither released nor lost, and the deadline has not passed."""
        return self.remaining() > 0.0

    @property
    def lost(self) -> bool:
        """True once the lease was lost; never goes back to False.

        True to the clock when read: past the deadline, the background loop first reads the
        reply of a renewal sent in time (Redis may have confirmed it), then says. In a
        process forked while the lease was held: always True (the lease is the parent's).
        """
        if not self._here():
            return True
        state = self._state
        if state is _State.HELD:
            if self._loop.time() < self._async.deadline:
                return False
            return self._settled_lost()
        return state is not _State.RELEASED

    @property
    def released(self) -> bool:
        """True once the holder released the lease."""
        return self._state is _State.RELEASED

    @property
    def loss_reason(self) -> LossReason | None:
        """Why the lease was lost, or None."""
        if not self._here():
            return LossReason.LOOP_CLOSED
        if self._state is _State.HELD and not self.lost:
            return None
        error = self._loss()
        return None if error is None else error.reason

    def __repr__(self) -> str:
        if not self._here():
            state = f"held by process {self._pid}"
        elif self._state is _State.HELD:
            state = f"held, {self.remaining():.3f}s left"
        else:
            state = self._state.value
        slot = "" if self.slot is None else f" slot={self.slot}"
        return (
            f"<aiolock.sync.Lease {self.name!r} fencing_token={self.fencing_token}{slot} "
            f"token={self.token[:6]}… {state}>"
        )

    # ----------------------------------------------------------------- checks
    def check(self) -> None:
        """Raise `LeaseLostError` unless the lease is still held: call it between steps of
        the body, before a write that must not happen unprotected.

        Costs no call to Redis nor to the background loop while the deadline is ahead
        (about a microsecond); past it, one hop to the loop, which reads what Redis
        answered.

        Raises:
            LeaseLostError: lost (the renewal was refused: within a third of the ttl after
                the key stopped holding the token, and a few milliseconds; Redis
                unreachable: at the deadline), or
                given back by `release_all`, or acquired by the process this one was
                forked from.
            RuntimeError: released by its holder.
        """
        if not self._here():
            raise self._forked()
        state = self._state
        if state is _State.HELD:
            if self._loop.time() < self._async.deadline or not self._settled_lost():
                return
            state = self._state
        if state is _State.RELEASED:
            raise RuntimeError(f"the lease on lock {self.name!r} was released")
        error = self._loss()
        assert error is not None
        raise error

    def loss_error(self, *, body_completed: bool | None = None) -> LeaseLostError:
        """A `LeaseLostError` describing this lease's loss (see asyncio's `Lease`)."""
        if not self._here():
            return self._forked()
        if self._state is _State.REVOKED:
            return self._revoked(body_completed)
        return self._async.loss_error(body_completed=body_completed)

    # ----------------------------------------------------------------- operations
    def extend(self, ttl: float | None = None) -> None:
        """Reset the lease's expiry to the full ttl now (or to a new `ttl`, seconds), in one
        round trip; see asyncio's `Lease.extend`.

        Raises:
            LeaseLostError: the key no longer holds this lease's token, or the deadline had
                passed, or Redis did not answer before it (it waits up to the deadline:
                reason `DEADLINE`, the `BackendError` as `__cause__`).
            BackendError: Redis refused the command or failed before the deadline (the
                lease stays valid until its deadline unless a renewal succeeds).
            RuntimeError: the lease was released; or the call was made from a thread that
                runs an event loop (see `aiolock.sync`).

        Interruption:
            Ctrl-C (or a signal handler's exception) stops the call; the lease stays valid
            until its current deadline either way.
        """
        _portal.check_caller("Lease.extend()")
        if not self._here():
            raise self._forked()
        if self._state is _State.REVOKED:
            raise self._revoked(None)
        lease = self._async
        _portal.portal().run(lambda: lease.extend(ttl))

    def release(self) -> None:
        """Give the lock up: delete the key if it is still ours, hand it to the next waiter.
        Calling it again after a successful release does nothing.

        Raises:
            LeaseLostError: the lease had been lost (or given back by `release_all`), or
                the key was no longer ours: the work done since was not protected. In a
                forked child, at once, with nothing sent (the lease is the parent's).
            BackendError: Redis could not be reached within the release timeout (5 s at
                most); the key expires by itself within the ttl.

        Interruption:
            The release runs to its end (a few seconds at most) on the background loop
            even if Ctrl-C arrives meanwhile; the interruption is raised after it.
        """
        if not self._here():
            raise self._forked()
        state = self._state
        if state is _State.RELEASED:
            return
        if state is _State.REVOKED:
            raise self._revoked(None)
        _portal.check_caller("Lease.release()")
        lease = self._async
        _portal.portal().run(lease.release, stop=False)

    # ----------------------------------------------------------------- with lease:
    def __enter__(self) -> Lease:
        """Guard a block with a lease got from `acquire()`: released at the block's exit,
        where a loss meanwhile raises `LeaseLostError` (see `exit_block`)."""
        if not self._here():
            raise self._forked()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.exit_block(exc)

    def exit_block(self, exc: BaseException | None) -> None:
        """What the end of a `with` block holding this lease does: release it, and say
        whether the body ran protected throughout.

        The body's own exception (`exc`) propagates unchanged, with a note if the lease was
        also lost meanwhile (not when it is the lease's own `check()` error). A release
        that fails because Redis cannot be reached is logged, not raised, when the lease was
        never lost: the work was protected and the key expires by itself.

        Raises:
            LeaseLostError: the lease was lost while the body ran (or was given back by
                `release_all`), and the body finished anyway: what it did after the loss
                was not protected (`body_completed` True). Chained to the cause. In a
                forked child: at once, with nothing sent.

        Interruption:
            As for `release()`.
        """
        if not self._here():
            if exc is None:
                raise self._forked()
            return
        release_error: BaseException | None = None
        try:
            self.release()
        except LeaseLostError:
            pass  # the state says it
        except (AiolockError, TimeoutError) as error:
            release_error = error
        if self._state in (_State.LOST, _State.REVOKED):
            if exc is None:
                raise self.loss_error(body_completed=True)
            own = isinstance(exc, LeaseLostError) and exc.fencing_token == self.fencing_token
            if not own:
                exc.add_note(
                    f"aiolock: the lease on lock {self.name!r} was also lost while this "
                    f"exception was raised ({self.loss_error()})"
                )
            return
        if release_error is not None:
            logger.warning(
                "aiolock: could not release lock %r (it expires by itself): %s",
                self.name,
                release_error,
            )

    # ----------------------------------------------------------------- internals
    def _here(self) -> bool:
        """Whether this process holds it (not a child forked after it was acquired)."""
        return self._generation == _portal.generation()

    def _loss(self) -> LeaseLostError | None:
        if self._state is _State.REVOKED:
            return self._revoked(None)
        return self._error

    def _settled_lost(self) -> bool:
        """Past the deadline: the loop reads what has arrived, and says if it is lost."""
        lease = self._async
        if self._loop.is_closed():
            return True
        if _portal.on_loop_thread():
            lease._check_deadline(settle=False, in_doubt_ok=True)
            return lease.lost
        running = _portal.running_portal()
        if running is None or running.loop is not self._loop:
            return True
        return running.run(lambda: _settle(lease))

    def _revoke(self) -> None:
        """On the loop, by `release_all`: the lease is about to be given back while its body
        may still run; from now on it says so."""
        if self._state is _State.HELD:
            self._state = _State.REVOKED
            _HELD.discard(self)

    def _revoked(self, body_completed: bool | None) -> LeaseLostError:
        detail = ""
        if body_completed is True:
            detail = "; the body ran to its end after that: what it did since was not protected"
        error = LeaseLostError(
            f"lease on lock {self.name!r} (fencing token {self.fencing_token}) was given back "
            f"by aiolock.sync.release_all() (the process is stopping){detail}",
            name=self.name,
            reason=LossReason.NOT_OWNER,
            fencing_token=self.fencing_token,
            body_completed=body_completed,
        )
        return error

    def _forked(self) -> LeaseLostError:
        return LeaseLostError(
            f"lease on lock {self.name!r} (fencing token {self.fencing_token}) belongs to "
            f"process {self._pid}, which this process was forked from while it was held: "
            "it is not held here (nothing was sent to Redis)",
            name=self.name,
            reason=LossReason.LOOP_CLOSED,
            fencing_token=self.fencing_token,
        )

    def __del__(self) -> None:
        if getattr(self, "_state", None) is not _State.HELD:
            return
        if not self._here():
            # The parent's (this is a forked child): kept, never collected, so that its
            # asyncio lease never tries to give back what is not this process's.
            _portal.forget(self._async)
            return
        warnings.warn(
            f"aiolock.sync lease on lock {self.name!r} was garbage-collected without being "
            "released; use 'with' or call release()",
            ResourceWarning,
            stacklevel=1,
            source=self,
        )
        lease, loop = self._async, self._loop

        def release() -> None:
            task = loop.create_task(_release_dropped(lease))
            _dropping.add(task)
            task.add_done_callback(_dropping.discard)

        with contextlib.suppress(RuntimeError):  # the loop was closed
            loop.call_soon_threadsafe(release)
