"""`Lease`: one acquisition of a lock, from grant to release or loss.

A lease knows its token, fencing token and local deadline, and nothing about how it was
granted: the `LeaseIssuer` that created it (a `Lock` today; Redlock, semaphores and
read-write locks later) does the Redis work for extend and release. Renewal is done by the
issuer's `RenewalScheduler`; the deadline is a timer owned here, so no slow batch can delay
a loss.

States: held → released (by its holder), or held → lost (Redis said "not owner", or the
deadline passed without a confirmed renewal). Loss is final: a late renewal reply never
brings a lost lease back.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import math
import warnings
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol, final

import anyio

from .._aio.arrivals import after_arrivals, arrivals
from .._aio.shielding import run_shielded
from .._model import events
from .._model import renewal_policy as renewal
from .._model.config import MIN_TTL, check_seconds
from ..errors import AiolockError, BackendError, LeaseLostError, LossReason
from .guard import BodyGuard, new_cancel_scope

if TYPE_CHECKING:
    from .watchdog import RenewalEntry, RenewalScheduler

__all__ = ("Lease", "LeaseIssuer", "held_leases")

logger = logging.getLogger("aiolock")

RELEASE_TIMEOUT: Final = 5.0
"""Longest wait for a release before giving up (the key then expires by its ttl)."""

STALL: Final = 0.05
"""A deadline noticed this much late (or more) was missed because the event loop did not
run: the loss is reported as a stall, with its length."""


class LeaseIssuer(Protocol):
    """What a lease needs from whatever granted it."""

    @property
    def name(self) -> str: ...

    async def _extend_lease(self, lease: Lease, *, timeout: float, ttl_ms: int) -> bool:
        """Reset the expiry to `ttl_ms`; True if still ours, False if not. Raises
        BackendError."""
        ...

    async def _release_lease(self, lease: Lease, *, timeout: float) -> bool:
        """Delete the key if ours; True if released (now or by an earlier attempt)."""
        ...

    def _guarding(self, lease: Lease, task: asyncio.Task[Any], *, entered: bool) -> None:
        """`lease` started (`entered`) or stopped guarding a block run by `task`."""
        ...


_HELD: weakref.WeakSet[Lease] = weakref.WeakSet()
"""Every lease of this process that is held (neither released nor lost)."""


def held_leases() -> list[Lease]:
    """A snapshot of the leases this process holds, for shutdown helpers."""
    return list(_HELD)


class _State(enum.Enum):
    HELD = "held"
    RELEASED = "released"
    LOST = "lost"


def _deadline_passed(ref: weakref.ref[Lease]) -> None:
    lease = ref()
    if lease is not None and lease._state is _State.HELD:
        lease._deadline_timer()


def _settled(ref: weakref.ref[Lease], reached: float) -> None:
    lease = ref()
    if lease is not None:
        lease._settling = False
        lease._check_deadline(settle=False, now=max(lease._loop.time(), reached))


@final
class Lease:
    """One acquisition of a lock (or one permit of a semaphore, one side of a read-write
    lock): held until released, or lost.

    Obtained from `Lock.acquire()`, `Lock.try_acquire()` or `async with lock as lease` (and
    the same on every primitive); not created directly. The watchdog renews it while held.

    Use it as an async context manager (`async with lock as lease:` does this for you) to
    have the body cancelled when the lease is lost; outside one, check `lost`, `remaining()`
    or await `wait_lost()`, and pass `fencing_token` to storage that can reject stale writers.

    Attributes:
        name: the lock's name.
        token: the secret that proves ownership in Redis (128 random bits, hex). Never
            shown whole by `repr` or in errors.
        fencing_token: a number strictly greater than that of every earlier lease of this
            name, across processes and across a Redis restart that lost all data (as long as
            the server's clock does not step back). Storage that remembers the highest token
            it has seen can reject writes from a holder whose lease was lost. A semaphore's
            permits, held side by side, draw from one sequence per semaphore: remember the
            highest per `slot` instead.
        slot: a semaphore permit's slot, from 0 to the limit minus 1: no two permits held
            at once share one, and a permit that was lost has its slot (and its place in
            the fencing order of that slot) taken by the next. None for other leases.
        permits: n for `Semaphore.acquire(permits=n)` (`slot` is its first), else 1.
    """

    __slots__ = (
        "__weakref__",
        "_ended",
        "_entry",
        "_granted_at",
        "_guard",
        "_guarded",
        "_issuer",
        "_loop",
        "_loss_cause",
        "_loss_reason",
        "_on_end",
        "_renew_error",
        "_renewal_stopped_by_max_hold",
        "_scheduler",
        "_scope",
        "_settling",
        "_stalled_for",
        "_state",
        "_timer",
        "_validity",
        "fencing_token",
        "name",
        "permits",
        "slot",
        "token",
    )

    def __init__(
        self,
        *,
        issuer: LeaseIssuer,
        token: str,
        fencing_token: int,
        ttl: float,
        margin: float,
        sent_at: float,
        scheduler: RenewalScheduler | None,
        make_entry: Callable[[weakref.ref[Lease]], RenewalEntry] | None,
        deadline: float | None = None,
        slot: int | None = None,
        permits: int = 1,
    ) -> None:
        self._issuer = issuer
        self.name, self.token, self.fencing_token = issuer.name, token, fencing_token
        self.slot, self.permits = slot, permits
        self._validity = renewal.Validity(
            sent_at=sent_at, ttl=ttl, margin=margin, deadline=deadline
        )
        self._loop = asyncio.get_running_loop()
        self._state = _State.HELD
        self._loss_reason: LossReason | None = None
        self._loss_cause: BaseException | None = None
        self._renew_error: BaseException | None = None
        self._renewal_stopped_by_max_hold = False
        self._ended: asyncio.Event | None = None  # made by wait_lost(), when needed
        self._on_end: list[Callable[[Lease], None]] | None = None  # see _when_ended
        self._scope: anyio.CancelScope | None = None
        self._guarded: asyncio.Task[Any] | None = None  # the task whose block it guards
        self._guard: BodyGuard | None = None
        self._settling = False
        self._stalled_for: float | None = None  # how late a missed deadline was noticed
        self._granted_at = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._arm_timer()
        self._scheduler = scheduler
        self._entry: RenewalEntry | None = None
        if scheduler is not None and make_entry is not None:
            self._entry = make_entry(weakref.ref(self))
            scheduler.add(self._entry)
        _HELD.add(self)

    # ----------------------------------------------------------------- state, read-only
    @property
    def deadline(self) -> float:
        """Local time (`loop.time()`, monotonic) until which the lease is valid for sure.

        Moves forward with each confirmed renewal: time the renewal was *sent*, plus the ttl,
        minus a safety margin, so delays before the reply shorten validity, never lengthen it.
        """
        return self._validity.deadline

    def remaining(self) -> float:
        """Seconds of validity the holder can still count on; 0.0 once released or lost,
        or once the deadline has passed (whether or not the loss was declared yet)."""
        if self._state is not _State.HELD or self._loop.is_closed():
            return 0.0
        return max(0.0, self._validity.deadline - self._loop.time())

    def held_for(self) -> float:
        """Seconds since the lease was granted (local clock)."""
        return self._loop.time() - self._granted_at

    @property
    def held(self) -> bool:
        """True while neither released nor lost, and the deadline has not passed: what to
        check before acting under the lease outside `async with`."""
        return self.remaining() > 0.0

    @property
    def lost(self) -> bool:
        """True once the lease was lost (see `loss_reason`); never goes back to False.

        True to the clock when read, even before the event loop has run again after a
        stall: a deadline that has passed makes the lease lost at once, unless a renewal
        sent in time is still unanswered. Its reply may already be waiting to be read (Redis
        confirmed it while the loop was blocked): for the few loop iterations it takes to
        read it, `lost` stays False while `held` is already False.
        """
        self._check_deadline(settle=False, in_doubt_ok=True)
        return self._state is _State.LOST

    @property
    def released(self) -> bool:
        """True once the holder released the lease."""
        return self._state is _State.RELEASED

    @property
    def loss_reason(self) -> LossReason | None:
        """Why the lease was lost, or None."""
        self._check_deadline(settle=False, in_doubt_ok=True)
        return self._loss_reason

    def __repr__(self) -> str:
        state = self._state.value
        if self._state is _State.HELD:
            state += f", {self.remaining():.3f}s left"
        elif self._loss_reason is not None:
            state += f" ({self._loss_reason.value})"
        return (
            f"<Lease {self.name!r} fencing_token={self.fencing_token}"
            f"{'' if self.slot is None else f' slot={self.slot}'} token={self.token[:6]}… {state}>"
        )

    async def wait_lost(self) -> LeaseLostError | None:
        """Wait until the lease ends: returns the loss as an error, or None if released.

        For code that holds a lease outside `async with` and wants to be told of a loss,
        e.g. in a task of its own that cancels the work. Returns at once if already ended.

        Cancellation:
            Safe to cancel; nothing is changed.
        """
        if self._state is _State.HELD:
            if self._ended is None:
                self._ended = asyncio.Event()
            await self._ended.wait()
        return self.loss_error() if self.lost else None

    def loss_error(self, *, body_completed: bool | None = None) -> LeaseLostError:
        """A `LeaseLostError` describing this lease's loss, with the cause chained.

        `body_completed` says, for the error of an `async with` block, whether the body ran
        to its end after the loss (True) or was cancelled midway (False).
        """
        reason = self._loss_reason or LossReason.NOT_OWNER
        detail = {
            LossReason.NOT_OWNER: "Redis no longer holds its token",
            LossReason.DEADLINE: "no renewal was confirmed before its deadline",
            LossReason.MAX_HOLD: "it was held longer than max_hold",
            LossReason.LOOP_CLOSED: "its event loop was closed, so nothing renewed it",
        }[reason]
        if self._stalled_for is not None:
            detail += (
                f" (the event loop did not run for at least {self._stalled_for:.3g}s: "
                "a blocking call, or a paused process)"
            )
        if body_completed is True:
            detail += (
                "; the body ran to its end after the loss: what it did since was not protected"
            )
        elif body_completed is False:
            detail += "; the body was cancelled midway"
        error = LeaseLostError(
            f"lease on lock {self.name!r} (fencing token {self.fencing_token}) was lost: {detail}",
            name=self.name,
            reason=reason,
            fencing_token=self.fencing_token,
            stalled_for=self._stalled_for,
            body_completed=body_completed,
        )
        error.__cause__ = self._loss_cause
        return error

    # ----------------------------------------------------------------- operations
    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lease's expiry to the full ttl now, in one round trip.

        The watchdog does this in the background; call it yourself when renewal is off
        (`renew=False`) or before a step that must not straddle a renewal.
        It waits for Redis up to the lease's deadline: on a server that does not answer
        (frozen, partitioned) it ends there, in the loss (see Raises).

        Args:
            ttl: a new ttl for the lease, seconds (0.01 to 1 year): the expiry is set to it
                now, and the watchdog renews to it from then on (at least every third of
                it). Default: the lease's ttl. Added in 0.1.

        Raises:
            ConfigError: `ttl` out of range (nothing is sent).
            LeaseLostError: the key no longer holds this lease's token, or the deadline had
                passed before the call, or Redis did not answer before it (reason
                `DEADLINE`, the `BackendError` as `__cause__`).
            BackendError: Redis refused the command or failed before the deadline; the
                lease is still held until its deadline unless a renewal succeeds.
            RuntimeError: the lease was already released.

        Cancellation:
            Safe to cancel: the expiry is either reset or not, and the lease stays valid
            until its current deadline either way.
        """
        new_ttl = None if ttl is None else check_seconds("ttl", ttl, minimum=MIN_TTL)
        self._check_not_released("extend")
        await self._settle_deadline()
        if self._state is _State.LOST:
            raise self.loss_error()
        target = self._validity.ttl if new_ttl is None else new_ttl
        sent_at = self._loop.time()
        self._renewal_sent(sent_at, target)
        error: BackendError | None = None
        try:
            ours = await self._issuer._extend_lease(
                self, timeout=max(self.remaining(), 0.001), ttl_ms=math.ceil(target * 1000)
            )
        except BackendError as failed:
            error, ours = failed, True
        finally:
            self._renewal_answered(sent_at, target)
        if error is not None:
            await self._settle_deadline()  # bounded by the deadline: lost once it passed
            if not self.lost:
                raise error
            self._loss_cause = self._loss_cause or error
            raise self.loss_error() from error
        if not ours:
            self._not_owner()
        elif new_ttl is not None and self._state is _State.HELD:
            self._retarget(new_ttl, sent_at)
        else:
            self._renewed(sent_at, self._validity.ttl)
        if self.lost:
            raise self.loss_error()

    async def release(self) -> None:
        """Give the lock up: stop renewal, delete the key if it is still ours, wake waiters.

        Calling it again after a successful release does nothing.

        Raises:
            LeaseLostError: the lease had been lost, or the key was no longer ours; the work
                done since the loss was not protected by the lock.
            BackendError: Redis could not be reached within the release timeout; the key
                will expire by itself within the ttl.

        Cancellation:
            The release runs to completion (for up to a few seconds) even if the caller is
            cancelled meanwhile, also by a native `Task.cancel()`; the cancellation is
            re-raised afterwards.
        """
        if self._state is _State.RELEASED:
            return
        if asyncio.get_running_loop() is not self._loop and not self._loop.is_closed():
            raise RuntimeError(
                f"the lease on lock {self.name!r} belongs to another event loop, which is still "
                "open: release it there (e.g. with asyncio.run_coroutine_threadsafe)"
            )
        await self._settle_deadline()
        self._stop_renewal()
        was_lost = self._state is _State.LOST
        timeout = min(max(self._validity.ttl, 0.5), RELEASE_TIMEOUT)
        try:
            try:
                ours = await self._issuer._release_lease(self, timeout=timeout)
            except asyncio.CancelledError:
                # Cancelled mid-release: whether it reached Redis is unknown. Releasing is
                # idempotent, so finish it in a task of its own that no cancellation
                # stops, then let the cancellation go on.
                with contextlib.suppress(AiolockError, TimeoutError):
                    await run_shielded(
                        self._issuer._release_lease(self, timeout=timeout),
                        timeout=timeout + 0.5,
                    )
                raise
        except TimeoutError as exc:  # only if the issuer's own bound failed
            raise BackendError(
                f"release of lock {self.name!r} did not finish within {timeout:g}s",
                operation="release",
                name=self.name,
            ) from exc
        except BaseException:
            if self._state is _State.HELD:
                self._finish(_State.RELEASED)
            raise
        if was_lost:
            raise self.loss_error()
        if not ours:
            self._lose(LossReason.NOT_OWNER, None)
            raise self.loss_error()
        self._finish(_State.RELEASED)
        self._emit(events.EventKind.RELEASED)

    # ----------------------------------------------------------------- context manager
    def __enter__(self) -> None:
        raise TypeError("use 'async with' with a Lease, not 'with'")

    def __exit__(self, *exc_info: object) -> None:  # pragma: no cover - __enter__ raises
        raise TypeError("use 'async with' with a Lease, not 'with'")

    async def __aenter__(self) -> Lease:
        """Guard the body: it is cancelled if the lease is lost while it runs."""
        if self._scope is not None:
            raise RuntimeError(f"lease on lock {self.name!r} is already guarding a block")
        self._check_not_released("guard a block")
        await self._settle_deadline()
        if self._state is _State.LOST:
            await self._cleanup_after_loss()
            raise self.loss_error()
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - asyncio always runs coroutines in a task
            raise RuntimeError("a lease must guard a block of an asyncio task")
        scope = new_cancel_scope()
        scope.__enter__()
        self._scope, self._guarded = scope, task
        self._guard = BodyGuard(task, scope, functools.partial(self._check_deadline, settle=True))
        self._issuer._guarding(self, task, entered=True)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the lease, and say whether the body ran protected throughout.

        Raises:
            LeaseLostError: the lease was lost while the body ran (the body was cancelled),
                or the body finished after the lease was gone. Chained to the cause.
            The body's own exception propagates unchanged, with a note if the lease was
            also lost meanwhile. A release that fails because Redis cannot be reached is
            logged, not raised, when the body finished while the lease was valid: the work
            was protected and the key expires by itself.

        Cancellation:
            Only the cancellation caused by the loss is turned into `LeaseLostError`; any
            other cancellation propagates untouched, after the release.
        """
        scope, self._scope = self._scope, None
        assert scope is not None, "__aexit__ without __aenter__"
        task, self._guarded = self._guarded, None
        guard, self._guard = self._guard, None  # (it refers to this lease: no cycle left)
        if guard is not None:
            guard.close()  # before the scope's exit: it takes back its own cancels
        if task is not None:
            self._issuer._guarding(self, task, entered=False)
        swallowed = bool(scope.__exit__(exc_type, exc, tb))
        release_error: BaseException | None = None
        try:
            await self.release()
        except LeaseLostError:
            pass  # the state says it; handled below
        except (AiolockError, TimeoutError) as error:
            release_error = error
        if self._state is _State.LOST:
            if swallowed or exc is None:
                raise self.loss_error(body_completed=not swallowed)
            if not isinstance(exc, asyncio.CancelledError):
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

    # ----------------------------------------------------------------- called by the watchdog
    def _retarget(self, ttl: float, sent_at: float) -> None:
        """The expiry was set to a new `ttl` by a request sent at `sent_at`: the lease has
        that ttl from now on (its deadline may move back), and is renewed to it.

        A renewal to the old ttl still in flight may reach Redis after this one and set its
        own expiry last: until it is answered, the shorter of the two counts, and its
        answer (counted with the old ttl) is then ignored.
        """
        self._validity.retarget(ttl, sent_at)
        self._arm_timer()
        if self._entry is not None:
            self._entry.ttl_ms = math.ceil(ttl * 1000)
            self._entry.interval = min(self._entry.interval, renewal.default_interval(ttl))
            if self._scheduler is not None:
                due = sent_at + self._entry.interval
                self._scheduler.postpone(self._entry, due)
                self._scheduler.hasten(self._entry, due)
        self._renew_error = None
        self._emit(events.EventKind.RENEWED)

    def _renewal_sent(self, sent_at: float, ttl: float) -> None:
        """A renewal setting the expiry to `ttl` was sent at `sent_at`."""
        self._validity.sent(sent_at, ttl)

    def _renewal_answered(self, sent_at: float, ttl: float) -> None:
        """The renewal sent at `sent_at` (expiry `ttl`) was answered, failed or given up."""
        self._validity.answered(sent_at, ttl)

    def _renewed(self, sent_at: float, ttl: float | None = None) -> None:
        """Redis confirmed a renewal sent at `sent_at` that set the expiry to `ttl`."""
        if self._state is not _State.HELD:
            return  # loss is final; a late success changes nothing
        if not self._validity.counts(sent_at):
            return  # sent with the ttl the lease had before extend(ttl=...)
        if self._validity.renewed(sent_at, ttl):
            self._arm_timer()
        self._renew_error = None
        self._emit(events.EventKind.RENEWED)

    def _renew_failed(self, error: BaseException) -> None:
        self._renew_error = error
        self._emit(events.EventKind.RENEWAL_FAILED, error=error)
        logger.debug("aiolock: renewal of lock %r failed, retrying: %s", self.name, error)

    def _renewal_stopped(self) -> None:
        self._renewal_stopped_by_max_hold = True

    def _not_owner(self) -> None:
        self._lose(LossReason.NOT_OWNER, None)

    def _deadline_timer(self) -> None:
        # A timer may run a clock tick early: the deadline counts as reached, once settled too.
        self._check_deadline(settle=True, now=max(self._loop.time(), self._validity.deadline))

    def _deadline_reached(self, now: float) -> None:
        late = now - self._validity.deadline
        if late >= STALL:
            self._stalled_for = late
        if self._renewal_stopped_by_max_hold:
            self._lose(LossReason.MAX_HOLD, None)
        else:
            self._lose(LossReason.DEADLINE, self._renew_error)

    # ----------------------------------------------------------------- internals
    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(
            self._validity.deadline, _deadline_passed, weakref.ref(self)
        )

    def _check_deadline(
        self, *, settle: bool, in_doubt_ok: bool = False, now: float | None = None
    ) -> None:
        """Declare the loss if the deadline has passed (the timer may not have run yet if
        the event loop was blocked).

        If a renewal sent in time is unanswered, its reply may have arrived meanwhile:
        `settle` lets the loop read what has arrived first (the check is made again
        then); `in_doubt_ok` leaves the lease as it is for now.
        """
        if self._state is not _State.HELD:
            return
        if self._loop.is_closed():
            self._lose(LossReason.LOOP_CLOSED, None)
            return
        if now is None:
            now = self._loop.time()
        if now < self._validity.deadline:
            return
        if self._validity.rescues(now):
            if settle and not self._settling:
                self._settling = True
                after_arrivals(self._loop, functools.partial(_settled, weakref.ref(self), now))
                return
            if in_doubt_ok or self._settling:
                return
        self._deadline_reached(now)

    async def _settle_deadline(self) -> None:
        """`_check_deadline` for async callers: past the deadline, a renewal sent in time
        and already confirmed by Redis is read before the loss is declared."""
        if self._state is _State.HELD and not self._loop.is_closed():
            now = self._loop.time()
            if now >= self._validity.deadline and self._validity.rescues(now):
                await arrivals()
        self._check_deadline(settle=False)

    def _check_not_released(self, action: str) -> None:
        if self._state is _State.RELEASED:
            raise RuntimeError(f"cannot {action}: the lease on lock {self.name!r} was released")

    def _stop_renewal(self) -> None:
        if self._entry is not None and self._scheduler is not None:
            self._scheduler.remove(self._entry)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _lose(self, reason: LossReason, cause: BaseException | None) -> None:
        if self._state is not _State.HELD:
            return
        self._loss_reason = reason
        self._loss_cause = cause
        self._finish(_State.LOST)
        logger.warning(
            "aiolock: lease on lock %r (fencing token %d) lost: %s",
            self.name,
            self.fencing_token,
            reason.value,
        )
        self._emit(events.EventKind.LOST, error=cause)
        if self._guard is not None and not self._loop.is_closed():
            self._guard.lost()  # cancels the block's scope

    def _emit(self, kind: events.EventKind, *, error: BaseException | None = None) -> None:
        if events.enabled():
            events.emit(
                events.LockEvent(
                    kind=kind,
                    name=self.name,
                    fencing_token=self.fencing_token,
                    hold=self.held_for(),
                    reason=self._loss_reason,
                    error=error,
                )
            )

    def _finish(self, state: _State) -> None:
        self._state = state
        _HELD.discard(self)
        self._stop_renewal()
        if self._ended is not None and not self._loop.is_closed():
            self._ended.set()
        callbacks, self._on_end = self._on_end, None
        for callback in callbacks or ():
            try:
                callback(self)
            except Exception:
                logger.exception("aiolock: a callback at the end of lease %r failed", self)

    def _when_ended(self, callback: Callable[[Lease], None]) -> None:
        """Call `callback(self)` when the lease ends (released or lost), or at once if it has:
        for what stands on leases (a `MultiLease`'s names, an election's `Term`). Called
        synchronously, where the lease ends; a callback that raises is logged."""
        if self._state is not _State.HELD:
            callback(self)
            return
        if self._on_end is None:
            self._on_end = []
        self._on_end.append(callback)

    async def _cleanup_after_loss(self) -> None:
        with contextlib.suppress(AiolockError, TimeoutError):
            await self.release()

    def __del__(self) -> None:
        if getattr(self, "_state", None) is not _State.HELD:
            return
        entry = self._entry
        if self._timer is not None:
            self._timer.cancel()
        warnings.warn(
            f"lease on lock {self.name!r} was garbage-collected without being released; "
            "use 'async with' or call release()",
            ResourceWarning,
            stacklevel=1,
            source=self,
        )
        if entry is not None and self._scheduler is not None:
            with contextlib.suppress(RuntimeError):  # the event loop is already closed
                self._scheduler.abandon(entry)
