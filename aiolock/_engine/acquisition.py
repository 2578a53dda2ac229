"""The acquisition engine: `Primitive`, the base of `Lock` and of every leased primitive,
whose holders get `Lease`s.

A primitive is a few objects, not layers of one class. `Primitive` is the public face
(`acquire`, `try_acquire`, `try_acquire_or_busy`, `resume`, `release_token`, `async with`),
its one attempt (`_attempt`: one acquire script call, its outcome made a lease or given
back) and the `LeaseIssuer` side that leases call (extend, release, the `async with`
guards). Its collaborators, each in a file of its own, are made when it needs them and
never kept by it (each refers to the primitive: kept, they would make a reference cycle,
left to the garbage collector):

- each `acquire()` call is an `AcquireCall` (`_engine.acquire_call`): the story of one
  acquisition, the fast path, the FIFO wait in the process's `WaitQueue` and its leaving;
- its release path (`_engine.release.ReleasePath`: the release, the abort of an acquire
  whose outcome is unknown, the withdrawal of the process's queue);
- its lease issuing (`_engine.lease_issuing.LeaseIssuing`: the leases made from answers
  and grants, which asks the renewal policy, `_model.renewal_policy`, for every timing
  decision).

What a primitive is made of and what its replies mean is `_engine.primitive_base`'s. A
primitive supplies what is its own: its keys and the calls the engine makes (acquire,
release, renew, resume) as a script, its keys and its arguments, in the common argument
conventions of `_lua.lock`; the meaning of the replies is shared (see ACQUIRE and RELEASE
there).
"""

from __future__ import annotations

import asyncio
import secrets
from types import TracebackType

from .._lua.lock import acquired
from .._model import renewal_policy as renewal
from .._model.config import check_timeout, check_token
from .._model.holder import task_name
from .._transport.call_options import CallOptions
from .._transport.clients import outcome_unknown, stalled_for
from ..errors import AcquireTimeoutError, BackendError, LeaseLostError, LossReason
from .acquire_call import MIN_ATTEMPT_TIMEOUT, AcquireCall
from .lease import Lease
from .lease_issuing import LeaseIssuing
from .primitive_base import UNSET, Attempt, Busy, Call, PrimitiveBase, Unset, check_within_ms
from .release import ABORT_TIMEOUT, ReleasePath, cleanup_budget
from .runtime import Runtime, runtime_for
from .wait_queue import Registration, Released, WaitQueue

__all__ = ("MIN_ATTEMPT_TIMEOUT", "UNSET", "Busy", "Call", "Primitive", "Released", "Unset")


class Primitive(PrimitiveBase):
    """A named primitive on one Redis server whose holders get `Lease`s.

    Subclasses call `__init__` with their client, name, configuration and keys, set the
    class attributes of `PrimitiveBase`, and supply `_acquire_call`.
    """

    __slots__ = ()

    # The primitive's collaborators, its release path and its lease issuing (which a lease
    # a release hands over here goes to), are made when asked, never kept: each refers to
    # the primitive, and a primitive keeping them would make a reference cycle, freed only
    # by the garbage collector (one per `Lock(...)`: its collections, gen 2 included, cost
    # an uncontended cycle a tenth of its time).
    @property
    def _release(self) -> ReleasePath:
        return ReleasePath(self, hand_over=self._hand_over)

    @property
    def _leases(self) -> LeaseIssuing:
        return LeaseIssuing(self, self._release)

    def _hand_over(self, runtime: Runtime, registration: Registration, reply: Released) -> None:
        self._leases.handed_over(runtime, registration, reply)

    async def _release_lease(self, lease: Lease, *, timeout: float) -> bool:
        return await self._release.release_lease(lease, timeout=timeout)

    # ----------------------------------------------------------------- acquiring
    async def acquire(
        self, *, timeout: float | Unset | None = UNSET, token: str | None = None
    ) -> Lease:
        """Wait for it and return the `Lease`.

        Args:
            timeout: seconds to wait; None waits forever, 0 tries once. Defaults to the
                primitive's `timeout`.
            token: the lease's token, chosen by the caller (16 to 128 characters from
                `[A-Za-z0-9_-]`, unique per lease: `secrets.token_hex(16)` or a UUID's hex)
                instead of a random one. A retry with the same token after a lost reply
                gets the same lease back, never a second one, and a lock already held under
                it is given back with its expiry reset to the ttl (acquire-or-extend). Such
                an acquire is therefore not undone when its reply is lost: the lock may stay
                held under the token, for up to the ttl, until the caller retries or
                releases it by token (`release_token`). Another process can take the lease
                over with `resume(token)`. Added in 0.1.

        Raises:
            AcquireTimeoutError: it stayed held by others for the whole timeout.
            BackendError: Redis could not be reached or refused the command.
            LeaseLostError: `token` was used for a lease that has ended by a release or an
                abort (and is still remembered: see the documentation's Data in Redis,
                Retention): a token is never granted twice.
            RuntimeError: the current task holds it in an `async with` block (through any
                object of this name on this client), and `timeout` is not 0: waiting
                would never end (or always time out). Nothing is sent. A single try
                (`timeout=0`, `try_acquire()`) is allowed, and finds it busy. Not
                recognised: a lease from `acquire()` that was never entered with
                `async with` (it may be handed to another task, which releases it), the same
                name through another client object, and a task that waits for another task
                waiting for it.

        Cancellation:
            A cancelled acquire leaves nothing held and nothing queued: if the acquire
            script may have run when the cancellation arrived, a token-guarded release
            (which also forbids a late-arriving acquire with that token) is sent under a
            shield before the cancellation propagates.
        """
        wait = self._config.timeout if isinstance(timeout, Unset) else check_timeout(timeout)
        if token is not None:
            token = check_token(token)
        runtime = runtime_for(self._client)
        self._refuse_reentry(runtime, wait)
        call = AcquireCall(
            self,
            runtime,
            wait=wait,
            token=token,
            attempt=self._attempt,
            leases=self._leases,
            release=self._release,
        )
        return await call.run()

    def _refuse_reentry(self, runtime: Runtime, wait: float | None) -> None:
        """Raise `RuntimeError` if the current task holds it and would wait for it."""
        task = asyncio.current_task()
        if wait != 0 and self._guard_reentry and runtime.guarded_by(self._key, task):
            raise RuntimeError(
                f"{self._what} {self._name!r} is already held by this task, in an 'async with' "
                f"block: waiting for it here would wait forever (it is not reentrant)"
            )

    async def try_acquire(self) -> Lease | None:
        """Try once, without waiting: the `Lease`, or None if someone else holds it.

        Raises:
            BackendError: Redis could not be reached or refused the command.

        Cancellation:
            As for `acquire()`.
        """
        try:
            return await self.acquire(timeout=0)
        except AcquireTimeoutError:
            return None

    async def try_acquire_or_busy(self) -> Lease | Busy:
        """Try once, without waiting: the `Lease`, or `Busy` saying who holds it and when
        to come back (what Redis said when it refused, at no extra round trip).

        Raises:
            BackendError: Redis could not be reached or refused the command.

        Cancellation:
            As for `acquire()`.

        Added in 0.1.
        """
        try:
            return await self.acquire(timeout=0)
        except AcquireTimeoutError as busy:
            return Busy(name=self._name, holder=busy.holder, retry_after=busy.retry_after)

    async def resume(self, token: str) -> Lease:
        """Take over the lease held under `token`, e.g. from another process of yours, or
        after this one restarted: its expiry is reset to the ttl, and from then on it is
        renewed, released and lost here like any lease. One round trip.

        The lease must still be held under that token (a lease that ended cannot be
        continued: acquire a new one).

        Raises:
            LeaseLostError: nothing is held under `token` (it ended, or never was); or, with
                reason `DEADLINE` and `stalled_for`, the answer came only after the
                lease's validity, or a stall of this process (a blocking call, a pause)
                spent the call's time: no lease is handed out past its validity, and the
                key is left as Redis has it.
            BackendError: Redis could not be reached or refused the command.
            ConfigError: `token` is not a valid token (nothing is sent).

        Cancellation:
            Safe to cancel: the lease's expiry is reset or not; it stays the holder's.

        Added in 0.1.
        """
        token = check_token(token)
        runtime = runtime_for(self._client)
        config = self._config
        validity = config.ttl - config.margin
        sent_at = runtime.loop.time()
        try:
            reply, acked = await self._run_waiting(
                runtime,
                self._resume_call(token, config.ttl_ms),
                timeout=validity,
                operation="resume",
                votes=None if self._votes is None else self._votes.resume,
            )
        except BackendError as error:
            stall = stalled_for(error)
            if stall is None:
                raise
            raise self._late_resume(stall) from error
        if int(reply[0]) != 1:
            raise LeaseLostError(
                f"{self._what} {self._name!r} is not held under the token given",
                name=self._name,
                reason=LossReason.NOT_OWNER,
            )
        late = runtime.loop.time() - (sent_at + validity)
        if late >= 0:
            # Answered too late to count on (this process was paused): no lease is handed
            # out past its validity. The key is left as Redis has it: held under the token,
            # which another holder of it may still be renewing.
            raise self._late_resume(late, fencing_token=int(reply[1]))
        self._check_replicated("resume", acked)
        first_due = renewal.first_due(sent_at, config.renew_interval)
        slot = int(reply[2]) if len(reply) > 2 else None
        permits = int(reply[3]) if len(reply) > 3 else 1
        lease = self._leases.new_lease(
            runtime, token, int(reply[1]), sent_at, first_due=first_due, slot=slot,
            permits=permits,
        )  # fmt: skip
        return self._granted(lease, 0.0, 1)

    def _late_resume(self, stall: float, *, fencing_token: int = 0) -> LeaseLostError:
        """The loss of a lease whose resume was answered past its validity, or whose time a
        stall of this process spent (for at least `stall` seconds)."""
        return LeaseLostError(
            f"lease on {self._what} {self._name!r} was lost: it could not be resumed within its "
            f"validity (the event loop did not run for at least {stall:.3g}s: a blocking call, "
            "or a paused process)",
            name=self._name,
            reason=LossReason.DEADLINE,
            fencing_token=fencing_token,
            stalled_for=stall,
        )

    async def release_token(self, token: str) -> bool:
        """Release the lease held under `token`, from any process: True if it was released
        (now, or already by an earlier release), False if it is not held under it: it never
        was, or it expired (its hold did not end as the token holder's, whoever got it
        next). Waiters are served as by any release. One round trip.

        A lease object held under `token` (here or in another process) finds the loss at
        its next renewal; released before that, its `release()` reports the token's
        release as its own (no error).

        Raises:
            BackendError: Redis could not be reached or refused the command.
            ConfigError: `token` is not a valid token (nothing is sent).

        Cancellation:
            Finished under a shield, as `Lease.release()`.

        Added in 0.1.
        """
        return await self._release.release_token(token)

    async def _attempt(
        self,
        runtime: Runtime,
        time_left: float | None,
        *,
        queue: WaitQueue | None = None,
        behind: int = 0,
        token: str | None = None,
        floor: float = MIN_ATTEMPT_TIMEOUT,
    ) -> Attempt:
        """One acquire script call: one round trip.

        `queue` is this process's wait queue for the name (None: do not queue), `behind`
        the number of this process's waiters queued behind the caller. The attempt puts a
        fresh registration in the queue's entry, and claims a grant to an earlier one.
        `token` is the caller's own (an attempt whose outcome is unknown is then kept, for
        the caller to retry), else a fresh random one.
        """
        config = self._config
        loop = runtime.loop
        chosen = token is not None
        token = token if token is not None else secrets.token_hex(16)
        task = task_name()
        validity = config.ttl - config.margin
        # A reply later than the lease's validity would be useless: bound the call by it,
        # and by the caller's wait, but give Redis at least a moment to answer even when
        # there is nothing left to wait (a single try, or the last one).
        bound = validity
        if time_left is not None:
            bound = min(validity, max(time_left, floor))
        registration: Registration | None = None
        queued: tuple[str, int, str] | None = None
        claims: list[str] = []
        sent_at = loop.time()
        if queue is not None:
            claims, registration = queue.attempt_started(self._grant_ms, sent_at)
            queued = (queue.wid, behind, self._entry(registration, task))
        script, keys, args = self._acquire_call(token, task, queued, claims)
        wait = config.wait_args(bound)
        # A timed attempt ends at its bound (the timeout): no grace.
        options = CallOptions(
            timeout=bound, operation="acquire", name=self._name, wait=wait, grace=time_left is None,
            votes=None if self._votes is None else self._votes.acquire,
        )  # fmt: skip
        try:
            reply = await runtime.backend.run(script, keys, args, options)
        except BaseException as exc:
            if queue is not None and registration is not None and not outcome_unknown(exc):
                queue.attempt_refused(registration)  # (a migrating slot, say): not in Redis
            if chosen:
                pass  # the caller's token: its retry gets the lease back (see acquire)
            elif isinstance(exc, asyncio.CancelledError):
                await self._release.abort(runtime, token, timeout=ABORT_TIMEOUT)
            elif outcome_unknown(exc):
                # Redis did not answer: its answer to the abort may not come either, and the
                # caller's timeout must hold (the key, if set, expires within the ttl).
                left = None if time_left is None else time_left - (loop.time() - sent_at)
                await self._release.abort(runtime, token, timeout=cleanup_budget(left))
            raise
        finally:
            if queue is not None:
                queue.attempt_ended()  # a head that waited for this attempt goes on
        acked = config.replicas
        if wait is not None:
            reply, acked = reply
        reply = acquired(reply)
        status, value = int(reply[0]), int(reply[1])
        if queue is not None and registration is not None and status != -1:
            queue.attempt_answered(registration, queued=status == 0, behind=behind)
        if status == -1 and chosen:
            raise LeaseLostError(
                f"{self._what} {self._name!r}: the token given was used for a lease that has "
                "ended; a token is never granted twice",
                name=self._name,
                reason=LossReason.NOT_OWNER,
            )
        if status != 1:
            if status != 0:
                return Attempt(None, -1)
            return Attempt(None, check_within_ms(reply), reply)
        if loop.time() >= sent_at + validity:
            # The reply came too late to be of use (this process was paused): give it back.
            await self._release.abort(runtime, token, timeout=ABORT_TIMEOUT)
            return Attempt(None, -1)
        if acked < config.replicas:
            # Taken on the primary, not on enough replicas: a failover could lose it. Give
            # it back (a caller's own token is kept for its retry, which waits again).
            if not chosen:
                await self._release.abort(runtime, token, timeout=ABORT_TIMEOUT)
            self._check_replicated("acquire", acked)
        first_due = renewal.first_due(sent_at, config.renew_interval)
        slot = int(reply[2]) if len(reply) > 2 else None
        lease = self._leases.new_lease(
            runtime, token, value, sent_at, first_due=first_due, slot=slot
        )
        return Attempt(lease, 0, free=int(reply[3]) if len(reply) > 3 else 0)

    # ----------------------------------------------------------------- async with
    def __enter__(self) -> None:
        raise TypeError(f"use 'async with' with a {type(self).__name__}, not 'with'")

    def __exit__(self, *exc_info: object) -> None:  # pragma: no cover - __enter__ raises
        raise TypeError(f"use 'async with' with a {type(self).__name__}, not 'with'")

    async def __aenter__(self) -> Lease:
        """Acquire (waiting up to the `timeout`) and guard the body with the lease.

        The lease is the current task's: another task sharing this object gets a lease of
        its own and cannot release this one. It is not reentrant: entering it again in the
        task that holds it raises `RuntimeError` instead of waiting forever.

        A lease lost before the body began (the event loop held between the acquire and
        the block, past the lease's validity; or a grant that lapsed before its first
        renewal reached Redis) protected no work: it is acquired again, within what is
        left of the timeout.

        Cancellation:
            As for `acquire()`.
        """
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - asyncio always runs coroutines in a task
            raise RuntimeError(f"{type(self).__name__} must be used from an asyncio task")
        loop = asyncio.get_running_loop()
        timeout = self._config.timeout
        started = loop.time()
        lease = await self.acquire()
        while True:
            try:
                await lease.__aenter__()
                break
            except LeaseLostError:
                await lease._cleanup_after_loss()
            except BaseException:
                await lease._cleanup_after_loss()
                raise
            left = None if timeout is None else max(timeout - (loop.time() - started), 0.0)
            lease = await self.acquire(timeout=left)
        self._held.entered(task, lease)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the current task's lease; see `Lease.__aexit__` for what is raised."""
        not_held = f"{self._what} {self._name!r} is not held by the current task"
        await self._held.exit(exc_type, exc, tb, not_held=not_held)
