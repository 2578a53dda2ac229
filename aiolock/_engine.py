"""The acquisition engine: everything between "a task awaits acquire()" and "a Lease exists",
and back at release, for every leased primitive alike.

`Primitive` is the base of `Lock` (and of every primitive on one Redis server). It owns:

- the fast path (one attempt when no task of this process waits for the name), then the
  FIFO wait: the process's `WaitQueue` (`_waiting`), where only the head talks to Redis,
  with a fresh `Registration` per attempt so that a release can grant the lock straight to
  this process; the caller's timeout, a fallback timer for expiries (which send no
  notification), and the wait's withdrawal when its last waiter leaves;
- turning an answer into a `Lease` (`_lease`): counted from when the request was sent, taken
  from a grant heard of in time (with its first renewal written before the body runs), or
  claimed by an acquire when heard of too late; registering it with the client's
  `RenewalScheduler` (`_watchdog`);
- the compensations: a cancelled or unanswered acquire is aborted (a release that also
  forbids that acquire from landing later), an answer that came after the lease's validity
  is given back, a cancelled release finishes under a shield;
- the release: token-guarded, putting this process's own waiters in line in the same call,
  and telling them at once what it did;
- the `LeaseIssuer` side (extend, release, the `async with` guards).

A primitive supplies what is its own: its keys and the three calls the engine makes (acquire,
release, renew) as a script, its keys and its arguments, in the common argument conventions
of `_scripts`; the meaning of the replies is shared (see ACQUIRE and RELEASE there).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import secrets
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Final, final

from . import _events as events
from ._backend import AsyncClient, is_cluster, migrating, outcome_unknown
from ._cancel import run_shielded
from ._config import LockConfig, check_timeout, check_token, safety_margin
from ._info import HOST, PID, LockInfo, task_name, text
from ._layout import RESERVATION_MS
from ._lease import Lease
from ._retry import Backoff, poll_delay
from ._runtime import Runtime, runtime_for
from ._scripts import RENEW, RESUME, Script, release_args
from ._waiting import Grant, Registration, Waiter, WaitQueue
from ._watchdog import RenewalEntry
from .errors import (
    AcquireTimeoutError,
    BackendError,
    ConfigError,
    LeaseLostError,
    LossReason,
    ReplicationError,
)

__all__ = ("UNSET", "Busy", "Call", "Primitive", "Released", "Unset")

MIN_ATTEMPT_TIMEOUT: Final = 1.0
"""Shortest time an acquire attempt gives Redis to answer (connecting included)."""
MIN_CLEANUP: Final = 0.1
"""Shortest time given to a cleanup, even when the caller's timeout is used up."""
ABORT_TIMEOUT: Final = 1.0
"""Longest wait for the cleanup of an acquire whose outcome is unknown."""
RECOUNT_DELAY: Final = 0.05
"""How soon a waiting head writes its process's entry again after waiters joined or left
(several arriving at once are counted by one command)."""

Call = tuple[Script, Sequence[str], list[str | int]]
"""One script call: the script, its KEYS and its ARGV."""


def _cleanup_budget(time_left: float | None) -> float:
    """How long a cleanup after a failed or abandoned wait may take: what is left of the
    caller's timeout (at least a moment, to try), at most ABORT_TIMEOUT."""
    if time_left is None:
        return ABORT_TIMEOUT
    return min(ABORT_TIMEOUT, max(time_left, MIN_CLEANUP))


class Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<the primitive's timeout>"


UNSET: Final = Unset()


@dataclass(frozen=True, slots=True)
class Released:
    """What one release call did (see RELEASE in `_scripts`)."""

    status: int  # 1 released now, 2 already, 3 a queue withdrawn, 0 not the owner
    handed_to: str  # the wait queue the lock was handed to, or ''
    granted: str  # the fencing token it was granted under, or ''
    seq: str  # the registration it was granted to, or ''
    expiry_ms: int  # the grant's expiry, or 0
    slot: str = ""  # the slot of a permit granted, or ''
    after: int = -1  # a semaphore's grant to the caller's queue: permits left free, -1 requeued


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Busy:
    """Someone else holds it: what Redis said when it refused a single try.

    Added in 0.2.
    """

    name: str
    holder: LockInfo | None
    """The holder, when the refusal named one (not for a lock kept for a queued process)."""
    retry_after: float | None
    """Seconds until it may be free: what is left of its typical hold when that is known
    (see `AcquireTimeoutError.retry_after`), else until the holder's key expires unless
    renewed. A hint, not a promise."""


@dataclass(frozen=True, slots=True)
class _Attempt:
    lease: Lease | None
    pttl_ms: int
    busy: Sequence[Any] = ()
    """An answer "held": {0, pttl, fencing token, holder, acquired ms, ttl ms, typical}."""
    free: int = 0
    """Leases still free after this one was acquired (a semaphore's permits)."""


def _busy_hint(name: str, busy: Sequence[Any]) -> tuple[LockInfo | None, float | None]:
    """The holder and a retry hint (seconds) from an answer "held" (see ACQUIRE).

    The hint is the holder's typical remaining hold when the lock's typical hold is known
    (what is left of it, at least 1 ms, never more than the key's remaining ttl), else the
    key's ttl. The typical hold is a moving average (1/8 each) over the holds whose
    release handed the lock on, or that refused an acquire of a caller that did not queue
    (a single try: each such hold is marked by the refusal, see ACQUIRE, and measured by
    its release): a lock only ever tried once, as a web endpoint's, learns it too.
    """
    if len(busy) < 7:
        return None, None
    pttl_ms = int(busy[1])
    fence, holder, acquired, ttl, typical = (text(value) for value in busy[2:7])
    info = None
    if fence and holder:
        info = LockInfo.of(
            name, fence=fence, holder=holder, acquired_ms=acquired, ttl_ms=ttl, pttl_ms=pttl_ms
        )
    if pttl_ms < 0:
        return info, None
    hint = pttl_ms / 1000
    if typical.isdigit() and info is not None and acquired.isdigit():
        held = max(time.time() - int(acquired) / 1000, 0.0)
        hint = min(hint, max(int(typical) / 1000 - held, 0.001))
    return info, hint


class Primitive(abc.ABC):
    """A named primitive on one Redis server whose holders get `Lease`s.

    Subclasses call `__init__` with their client, name, configuration and keys, set the
    class attributes below, and supply `_acquire_call`.
    """

    __slots__ = ("_channel", "_client", "_config", "_held", "_key", "_name", "_release_keys")

    _what: ClassVar[str] = "lock"
    """What the primitive is called in messages."""
    _release_script: ClassVar[Script]
    """The release script: RELEASE's ARGV and replies (see `_scripts`)."""
    _renew_kind: ClassVar[str] = ""
    """How `_key` holds a lease, for RENEW and RESUME (see `_scripts`)."""
    _exclusive: ClassVar[bool] = True
    """One holder at a time (else, once a waiter got in, the next may get in too)."""
    _guard_reentry: ClassVar[bool] = True
    """A task that holds it and waits for it again would wait forever: refused."""
    _requeued_on_grant: ClassVar[bool] = False
    """The scripts put a queue that was granted a lease back in line (a semaphore's)."""
    _max_poll: ClassVar[float | None] = None
    """Longest sleep of a waiting head between its tries (a waiting writer's refresh)."""

    _client: AsyncClient
    _name: str
    _config: LockConfig
    _key: str
    _channel: str
    _release_keys: Sequence[str]
    _held: list[tuple[asyncio.Task[Any], Lease]]

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        config: LockConfig,
        *,
        key: str,
        channel: str,
        release_keys: Sequence[str],
    ) -> None:
        """`key`: the key a lease's token lives in, which its renewals extend; `channel`:
        where grants to this primitive's waiters are announced; `release_keys`: KEYS of its
        release script (as RELEASE's). The client and the name are checked already."""
        if config.replicas and is_cluster(client):
            raise ConfigError(
                "replicas cannot be used with a redis.asyncio.RedisCluster client (WAIT must "
                "follow the script on the same connection); use replicas=0",
                argument="replicas",
                value=config.replicas,
            )
        self._client = client
        self._name = name
        self._config = config
        self._key = key
        self._channel = channel
        self._release_keys = release_keys
        self._held = []  # (task, lease) of each `async with` block in progress

    # ----------------------------------------------------------------- what a primitive supplies
    @abc.abstractmethod
    def _acquire_call(
        self, token: str, task: str, queue: tuple[str, int, str] | None, claims: Sequence[str]
    ) -> Call:
        """The acquire script call for `token` (see ACQUIRE's ARGV conventions)."""

    def _release_call(
        self,
        *,
        token: str = "",
        retain_ms: int | None = None,
        held_ms: int | None = None,
        renewed: bool = True,
        abort: bool = False,
        forced: bool = False,
        look_at_queue: bool = False,
        withdraw: str = "",
        join: tuple[str, str, int] | None = None,
        claims: Sequence[str] = (),
    ) -> Call:
        """The release script call (see RELEASE's ARGV conventions)."""
        args = release_args(
            token=token,
            retain_ms=retain_ms,
            held_ms=held_ms,
            renewed=renewed,
            abort=abort,
            forced=forced,
            look_at_queue=look_at_queue,
            withdraw=withdraw,
            join=join,
            claims=claims,
        )
        return self._release_script, self._release_keys, args

    def _renew_call(self, token: str, ttl_ms: int) -> Call:
        """The call that resets the expiry of the lease under `token` to `ttl_ms`."""
        return RENEW, (self._key,), [token, ttl_ms, self._renew_kind]

    def _resume_call(self, token: str, ttl_ms: int) -> Call:
        """The call answering {1, fencing token[, slot]} if a lease is held under `token`
        (its expiry then reset to `ttl_ms`), else {0}."""
        return RESUME, (self._key,), [token, ttl_ms, self._renew_kind]

    # ----------------------------------------------------------------- properties
    @property
    def name(self) -> str:
        return self._name

    @property
    def ttl(self) -> float:
        return self._config.ttl

    @property
    def timeout(self) -> float | None:
        return self._config.timeout

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
                over with `resume(token)`. Added in 0.2.

        Raises:
            AcquireTimeoutError: it stayed held by others for the whole timeout.
            BackendError: Redis could not be reached or refused the command.
            LeaseLostError: `token` was used for a lease that has ended by a release or an
                abort (and is still remembered, see the README's Retention): a token is
                never granted twice.
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
        task = asyncio.current_task()
        if wait != 0 and self._guard_reentry and runtime.guarded_by(self._key, task):
            raise RuntimeError(
                f"{self._what} {self._name!r} is already held by this task, in an 'async with' "
                f"block: waiting for it here would wait forever (it is not reentrant)"
            )
        loop = runtime.loop
        started = loop.time()
        deadline = None if wait is None else started + wait
        notifier = runtime.notifier
        channel = self._channel
        # The tasks of this process that wait are served in the order they called; a lease
        # that a later caller gets while an earlier one waits goes to the earlier one.
        ticket = notifier.ticket()
        orderly = wait != 0 and token is None
        attempts = 0
        busy: Sequence[Any] = ()

        def time_left() -> float | None:
            return None if deadline is None else deadline - loop.time()

        # Fast path: nobody of this process is queued, so try before subscribing (several
        # tasks may try at once). Otherwise queue behind them (first come, first served),
        # unless this is a single try.
        pttl_ms = self._config.ttl_ms
        handed_on = False
        if wait == 0 or notifier.queue_length(channel) == 0:
            attempts += 1
            if orderly:
                notifier.start_try(channel, ticket)
            try:
                attempt = await self._attempt(runtime, time_left(), token=token)
            except BackendError as exc:
                if not migrating(exc):
                    if orderly:
                        notifier.end_try(channel, ticket)
                    raise
                attempt = _Attempt(None, -1)  # its cluster slot migrates: wait, as for a holder
            except BaseException:
                if orderly:
                    notifier.end_try(channel, ticket)
                raise
            if attempt.lease is not None:
                if orderly:
                    notifier.end_try(channel, ticket)
                    handed_on = await self._hand_to_earlier(runtime, attempt.lease, ticket)
                if not handed_on:
                    return self._granted(attempt.lease, loop.time() - started, attempts)
            else:
                pttl_ms, busy = attempt.pttl_ms, attempt.busy
        if wait == 0:
            raise self._timeout_error(wait, loop.time() - started, attempts, busy)

        # (A refused first try joins in the same step as it ends: whoever waits for it to
        # be answered finds it in the queue.)
        waiter = notifier.join(channel, ticket, accepts=token is None)
        notifier.end_try(channel, ticket)
        queue = waiter.queue
        acquired = False
        more = False  # leases may still be free for the next waiter here (a semaphore)
        try:
            await notifier.ready(waiter, timeout=time_left())
            must_try = waiter.is_head and not handed_on
            unknown_pttl = Backoff(base=0.01, cap=1.0, rng=notifier.rng)
            while True:
                if waiter.handed is not None:
                    # Handed by a task of this process that called later and got a lease.
                    taken = self._take_handed(waiter)
                    acquired, more = True, not self._exclusive
                    return self._granted(taken, loop.time() - started, attempts)
                if waiter.is_head and (
                    queue.attempting or notifier.trying_before(channel, waiter.ticket)
                ):
                    # An earlier caller's first try is in flight: if refused, it queues
                    # ahead of this one (which is nudged when it is answered).
                    remaining = time_left()
                    if remaining is not None and remaining <= 0:
                        raise self._timeout_error(wait, loop.time() - started, attempts, busy)
                    await waiter.wait(remaining, pending_ok=True)
                    continue
                if waiter.is_head and (grant := queue.pop_grant()) is not None:
                    # A lease under the caller's own token claims the grant by an acquire.
                    lease = None if token is not None else self._lease_from_grant(runtime, grant)
                    if lease is not None:
                        queue.took(grant, requeued=self._requeued_on_grant and grant.requeued)
                        # A grant takes the queue out of Redis: a next waiter puts it back
                        # (woken now if more may be free, else by the next release).
                        if self._config.replicas:
                            await self._confirm_granted(runtime, lease)
                        else:
                            try:
                                short = grant.expiry_ms < self._config.ttl_ms
                                await self._renew_granted(runtime, lease, short=short)
                            except asyncio.CancelledError:
                                await lease._cleanup_after_loss()  # never reached its caller
                                raise
                        if not await self._keep_or_hand(runtime, lease, waiter):
                            acquired, more = True, not self._exclusive and grant.more
                            return self._granted(lease, loop.time() - started, attempts)
                        continue
                    must_try = True  # heard of too late to count on: claim it by an acquire
                if waiter.is_head and queue.joining:
                    # A release here is putting the queue in line: its answer comes first
                    # (it nudges the head), unless the caller's timeout comes before it.
                    remaining = time_left()
                    if remaining is not None and remaining <= 0:
                        raise self._timeout_error(wait, loop.time() - started, attempts, busy)
                    await waiter.wait(remaining, pending_ok=True)
                    continue
                if waiter.is_head and (waiter.take_wakeup() or must_try):
                    must_try = False
                    attempts += 1
                    try:
                        attempt = await self._attempt(
                            runtime,
                            time_left(),
                            queue=queue,
                            behind=len(queue.waiters) - 1,
                            token=token,
                        )
                    except BackendError as exc:
                        if not migrating(exc):
                            raise
                        # Its cluster slot migrates (a name's keys on both sides): nothing
                        # was applied; try again after a pause, as for an unknown expiry.
                        attempt = _Attempt(None, -1)
                    if attempt.lease is not None:
                        if not await self._keep_or_hand(runtime, attempt.lease, waiter):
                            acquired, more = True, attempt.free > 0
                            return self._granted(attempt.lease, loop.time() - started, attempts)
                        continue
                    pttl_ms, busy = attempt.pttl_ms, attempt.busy or busy
                remaining = time_left()
                if remaining is not None and remaining <= 0:
                    raise self._timeout_error(wait, loop.time() - started, attempts, busy)
                delay = remaining
                if waiter.is_head:
                    # The backoff only paces checks of a key whose expiry is unknown.
                    fallback = unknown_pttl.next() if pttl_ms <= 0 else 0.0
                    poll = poll_delay(pttl_ms, fallback=fallback, rng=notifier.rng)
                    if self._max_poll is not None:
                        poll = min(poll, self._max_poll)
                    if queue.miscounted:
                        poll = min(poll, RECOUNT_DELAY)  # the next try writes the count
                    delay = poll if remaining is None else min(poll, remaining)
                # A wake-up pending for a waiter that is no longer the head (an earlier
                # caller queued ahead of it) waits until it is the head again.
                timed_out = await waiter.wait(delay, pending_ok=not waiter.is_head)
                waiter.check()
                if waiter.poll_hint_ms is not None:  # the lock was handed to another process
                    pttl_ms, waiter.poll_hint_ms = waiter.poll_hint_ms, None
                if timed_out and waiter.is_head:
                    must_try = True
        finally:
            if waiter.handed is not None:
                # Handed a lease it did not take (it timed out, or was cancelled): the next
                # waiter takes it, or it is released.
                self._pass_on(runtime, self._take_handed(waiter), but=waiter)
            leaving = notifier.leave(waiter, acquired=acquired, more=more)
            if leaving is not None:
                # The last waiter of this process left: take its queue out of Redis, and
                # hand on a lock reserved or granted to it meanwhile (after an acquire, in
                # the background: the caller has its lease).
                budget = _cleanup_budget(time_left())
                if acquired:
                    await self._withdraw_in_background(runtime, leaving, timeout=budget)
                else:
                    with contextlib.suppress(BackendError, TimeoutError):
                        await run_shielded(
                            self._withdraw(runtime, leaving, timeout=budget),
                            timeout=budget + 0.1,
                        )

    @staticmethod
    def _take_handed(waiter: Waiter) -> Lease:
        lease, waiter.handed = waiter.handed, None
        assert isinstance(lease, Lease)
        return lease

    async def _hand_to_earlier(self, runtime: Runtime, lease: Lease, ticket: int) -> bool:
        """Hand `lease`, which the acquire() call `ticket` got, to the waiter of an earlier
        call of this process, if one waits for it (once the first tries of earlier calls
        in flight are answered: a refused one queues). True if it was handed on.

        Cancellation:
            The lease never reaches a caller: it is released under a shield first.
        """
        notifier = runtime.notifier
        if notifier.trying_before(self._channel, ticket):
            try:
                await notifier.tries_before(self._channel, ticket)
            except BaseException:
                await lease._cleanup_after_loss()
                raise
        receiver = notifier.first_before(self._channel, ticket)
        if receiver is None:
            return False
        receiver.hand(lease)
        return True

    async def _keep_or_hand(self, runtime: Runtime, lease: Lease, waiter: Waiter) -> bool:
        """A waiter got `lease`: False if it keeps it, True if it went to another waiter
        (one of an earlier call, or any other if this one was handed a lease meanwhile)."""
        if waiter.handed is not None:
            self._pass_on(runtime, lease, but=waiter)
            return True
        return await self._hand_to_earlier(runtime, lease, waiter.ticket)

    def _pass_on(self, runtime: Runtime, lease: Lease, *, but: Waiter) -> None:
        """Give a lease nobody here took to the first waiter without one, or release it."""
        receiver = runtime.notifier.next_without(self._channel, but)
        if receiver is not None:
            receiver.hand(lease)
        else:
            runtime.spawn(lease._cleanup_after_loss())

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

        Added in 0.2.
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
            LeaseLostError: nothing is held under `token` (it ended, or never was).
            BackendError: Redis could not be reached or refused the command.
            ConfigError: `token` is not a valid token (nothing is sent).

        Cancellation:
            Safe to cancel: the lease's expiry is reset or not; it stays the holder's.

        Added in 0.2.
        """
        token = check_token(token)
        runtime = runtime_for(self._client)
        config = self._config
        sent_at = runtime.loop.time()
        reply, acked = await self._run_waiting(
            runtime,
            self._resume_call(token, config.ttl_ms),
            timeout=config.ttl - config.margin,
            operation="resume",
        )
        if int(reply[0]) == 1:
            self._check_replicated("resume", acked)
        if int(reply[0]) != 1:
            raise LeaseLostError(
                f"{self._what} {self._name!r} is not held under the token given",
                name=self._name,
                reason=LossReason.NOT_OWNER,
            )
        interval = config.renew_interval
        first_due = None if interval is None else sent_at + interval
        slot = int(reply[2]) if len(reply) > 2 else None
        lease = self._new_lease(
            runtime, token, int(reply[1]), sent_at, first_due=first_due, slot=slot
        )
        return self._granted(lease, 0.0, 1)

    async def release_token(self, token: str) -> bool:
        """Release the lease held under `token`, from any process: True if it was released
        (now, or already by an earlier release), False if it is not held under it: it never
        was, or it expired (its hold did not end as the token holder's, whoever got it
        next). Waiters are served as by any release. One round trip.

        Raises:
            BackendError: Redis could not be reached or refused the command.
            ConfigError: `token` is not a valid token (nothing is sent).

        Cancellation:
            Finished under a shield, as `Lease.release()`.

        Added in 0.2.
        """
        token = check_token(token)
        runtime = runtime_for(self._client)
        status = await run_shielded(
            self._release_token(runtime, token, abort=False, timeout=ABORT_TIMEOUT * 5),
            timeout=ABORT_TIMEOUT * 5 + 0.5,
        )
        return status != 0

    async def _attempt(
        self,
        runtime: Runtime,
        time_left: float | None,
        *,
        queue: WaitQueue | None = None,
        behind: int = 0,
        token: str | None = None,
    ) -> _Attempt:
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
            bound = min(validity, max(time_left, MIN_ATTEMPT_TIMEOUT))
        registration: Registration | None = None
        queued: tuple[str, int, str] | None = None
        claims: list[str] = []
        sent_at = loop.time()
        if queue is not None:
            claims = queue.claim_tokens()
            registration = queue.register(self._grant_ms, sent_at)
            queued = (queue.wid, behind, self._entry(registration, task))
            queue.attempting = True
        script, keys, args = self._acquire_call(token, task, queued, claims)
        wait = config.wait_args(bound)
        try:
            reply = await runtime.backend.run(
                script, keys, args, timeout=bound, operation="acquire", name=self._name, wait=wait
            )
        except BaseException as exc:
            if queue is not None and registration is not None and not outcome_unknown(exc):
                queue.forget(registration)  # refused (a migrating slot, say): not in Redis
            if chosen:
                pass  # the caller's token: its retry gets the lease back (see acquire)
            elif isinstance(exc, asyncio.CancelledError):
                await self._abort(runtime, token, timeout=ABORT_TIMEOUT)
            elif outcome_unknown(exc):
                # Redis did not answer: its answer to the abort may not come either, and the
                # caller's timeout must hold (the key, if set, expires within the ttl).
                left = None if time_left is None else time_left - (loop.time() - sent_at)
                await self._abort(runtime, token, timeout=_cleanup_budget(left))
            raise
        finally:
            if queue is not None:
                queue.attempting = False
                if queue.waiters:
                    queue.waiters[0].nudge()  # a head that waited for this attempt goes on
        acked = config.replicas
        if wait is not None:
            reply, acked = reply
        status, value = int(reply[0]), int(reply[1])
        if queue is not None and registration is not None and status != -1:
            queue.settle(registration, in_redis=status == 0 or behind > 0)
            # The entry now counts this waiter and those behind it (those behind it alone
            # once it acquired; none left: no entry).
            queue.counted = behind + 1 if status == 0 else behind or None
        if status == -1 and chosen:
            raise LeaseLostError(
                f"{self._what} {self._name!r}: the token given was used for a lease that has "
                "ended; a token is never granted twice",
                name=self._name,
                reason=LossReason.NOT_OWNER,
            )
        if status != 1:
            return _Attempt(None, value if status == 0 else -1, reply if status == 0 else ())
        if loop.time() >= sent_at + validity:
            # The reply came too late to be of use (this process was paused): give it back.
            await self._abort(runtime, token, timeout=ABORT_TIMEOUT)
            return _Attempt(None, -1)
        if acked < config.replicas:
            # Taken on the primary, not on enough replicas: a failover could lose it. Give
            # it back (a caller's own token is kept for its retry, which waits again).
            if not chosen:
                await self._abort(runtime, token, timeout=ABORT_TIMEOUT)
            self._check_replicated("acquire", acked)
        interval = config.renew_interval
        first_due = None if interval is None else sent_at + interval
        slot = int(reply[2]) if len(reply) > 2 else None
        lease = self._new_lease(runtime, token, value, sent_at, first_due=first_due, slot=slot)
        return _Attempt(lease, 0, free=int(reply[3]) if len(reply) > 3 else 0)

    # ----------------------------------------------------------------- leases
    def _new_lease(
        self,
        runtime: Runtime,
        token: str,
        fencing_token: int,
        sent_at: float,
        *,
        first_due: float | None,
        deadline: float | None = None,
        slot: int | None = None,
    ) -> Lease:
        """A lease under `token`, renewed from `first_due` on (None: not renewed)."""
        config = self._config
        return Lease(
            issuer=self,
            token=token,
            fencing_token=fencing_token,
            slot=slot,
            ttl=config.ttl,
            margin=config.margin,
            sent_at=sent_at,
            deadline=deadline,
            scheduler=None if first_due is None else runtime.scheduler,
            make_entry=None
            if first_due is None
            else lambda ref: self._renewal_entry(
                ref,
                token=token,
                fencing_token=fencing_token,
                sent_at=sent_at,
                due=first_due,
                runtime=runtime,
            ),
        )

    @property
    def _grant_ms(self) -> int:
        """How long a grant to this primitive's waiters is held before it is renewed."""
        return min(self._config.ttl_ms, RESERVATION_MS)

    def _entry(self, registration: Registration, task: str) -> str:
        """The tail of this process's entry in the wait queue in Redis (see ACQUIRE)."""
        r = registration
        ttl_ms = self._config.ttl_ms
        return f"{HOST} {PID} {r.seq} {r.grant_ms} {ttl_ms} {r.token} {task}"

    def _lease_from_grant(self, runtime: Runtime, grant: Grant) -> Lease | None:
        """The lease for a grant heard of in time, or None if it must first be claimed.

        The grant was made after `grant.sent_at` with its expiry (the full ttl when this
        process granted it to itself, else at most RESERVATION_MS), so the lease is valid
        until then, or for this primitive's ttl if that is shorter (its renewals set that),
        minus the margin. It is taken only with at least half of that left, and only by a
        primitive that renews. A lease valid for less than its ttl is renewed at once (see
        `_renew_granted`), and by the watchdog within a third of its validity.
        """
        config = self._config
        if config.renew_interval is None:
            return None
        validity = min(grant.expiry_ms / 1000, config.ttl)
        sent_at = grant.sent_at
        if runtime.loop.time() >= sent_at + validity / 2:
            return None
        return self._new_lease(
            runtime,
            grant.registration.token,
            grant.fencing_token,
            sent_at,
            first_due=sent_at + min(config.renew_interval, validity / 3),
            deadline=grant.valid_until(validity, safety_margin(validity)),
            slot=grant.slot,
        )

    async def _renew_granted(self, runtime: Runtime, lease: Lease, *, short: bool) -> None:
        """Renew a lease taken from a `short` grant (shorter than the ttl: another process's
        release) to its full ttl, before its body runs. A grant of the full ttl (this
        process's own release) is left to the watchdog, however late it was heard of.

        The renewal is sent on the user's client now, in a task of its own; this waits
        until it has been written (never for its answer), so that an event-loop stall at
        the start of the body finds it confirmed by Redis, as a lease acquired with its
        full ttl would be: its reply, read when the loop runs again, counts (see `_settle`).
        It is sent as EVAL, with the script's text: a server that does not know the script
        (restarted, flushed) runs it all the same, where EVALSHA's NOSCRIPT answer would
        make it go again only after the stall. Through a client on which aiolock cannot
        see when a command is written (`Backend.sees_writes`: a cluster, say), its answer
        is awaited instead; on a cluster it goes through aiolock's own cluster client, as
        renewals do. Either wait lasts at most half of what the grant has left. The
        watchdog's own schedule goes on regardless.
        """
        config = self._config
        loop = runtime.loop
        entry = lease._entry
        if entry is None or not short:
            return
        backend = runtime.backend
        written = loop.create_future()
        answered = loop.create_future()

        def on_sent() -> None:
            if not written.done():
                written.set_result(None)

        async def renew() -> None:
            sent_at = loop.time()
            lease._renewal_sent(sent_at, config.ttl)
            script, keys, args = self._renew_call(lease.token, config.ttl_ms)
            try:
                ours = await runtime.backend.run(
                    script,
                    keys,
                    args,
                    timeout=max(lease.deadline - sent_at, 0.001),
                    operation="renew",
                    name=self._name,
                    on_sent=on_sent,
                    by_text=True,
                    background=backend.cluster,
                )
            except BackendError as exc:
                lease._renew_failed(exc)
                return
            finally:
                lease._renewal_answered(sent_at)
                on_sent()
                if not answered.done():
                    answered.set_result(None)
            if int(ours[0]) == 1:
                lease._renewed(sent_at, config.ttl)
                if config.renew_interval is not None:
                    runtime.scheduler.postpone(entry, sent_at + config.renew_interval)
            else:
                lease._not_owner()

        runtime.spawn(renew())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(lease.deadline - loop.time(), 0) / 2):
                await (written if backend.sees_writes else answered)

    async def _confirm_granted(self, runtime: Runtime, lease: Lease) -> None:
        """With `replicas=N`, a lease taken from a grant (written by a release, of this
        process or another) counts only once N replicas have it: its renewal to the full
        ttl is sent with a `WAIT`, and both answers are awaited before the body runs (one
        round trip). A grant that cannot be confirmed is released, and this raises.

        Cancellation:
            The lease never reaches the caller: it is released under a shield first.
        """
        config = self._config
        sent_at = runtime.loop.time()
        lease._renewal_sent(sent_at, config.ttl)
        try:
            reply, acked = await self._run_waiting(
                runtime,
                self._renew_call(lease.token, config.ttl_ms),
                timeout=max(lease.deadline - sent_at, 0.001),
                operation="acquire",
            )
        except BaseException:
            lease._renewal_answered(sent_at)
            await lease._cleanup_after_loss()
            raise
        lease._renewal_answered(sent_at)
        if int(reply[0]) != 1:
            lease._not_owner()
            raise lease.loss_error()
        if acked < config.replicas:
            await lease._cleanup_after_loss()
            self._check_replicated("acquire", acked)
        lease._renewed(sent_at, config.ttl)
        if lease._entry is not None and config.renew_interval is not None:
            runtime.scheduler.postpone(lease._entry, sent_at + config.renew_interval)

    async def _run_waiting(
        self, runtime: Runtime, call: Call, *, timeout: float, operation: str
    ) -> tuple[Any, int]:
        """Run `call`, followed by a WAIT for the replicas if this primitive needs any
        (`replicas=N`): its reply, and how many replicas acknowledged (`replicas` when it
        needs none)."""
        script, keys, args = call
        wait = self._config.wait_args(timeout)
        reply = await runtime.backend.run(
            script, keys, args, timeout=timeout, operation=operation, name=self._name, wait=wait
        )
        if wait is None:
            return reply, self._config.replicas
        answer, acked = reply
        return answer, acked

    def _check_replicated(self, operation: str, acked: int) -> None:
        """Raise `ReplicationError` if fewer than `replicas` replicas acknowledged."""
        config = self._config
        if acked < config.replicas:
            raise ReplicationError(
                f"{operation} of {self._what} {self._name!r}: {acked} of the {config.replicas} "
                f"replicas required acknowledged within {config.replica_timeout:g}s",
                operation=operation,
                name=self._name,
                replicas=config.replicas,
                acknowledged=acked,
            )

    def _renewal_entry(
        self,
        ref: weakref.ref[Lease],
        *,
        token: str,
        fencing_token: int,
        sent_at: float,
        due: float,
        runtime: Runtime,
    ) -> RenewalEntry:
        config = self._config
        assert config.renew_interval is not None
        return RenewalEntry(
            lease_ref=ref,
            key=self._key,
            release=lambda: self._release_token(
                runtime,
                token,
                abort=False,
                timeout=ABORT_TIMEOUT,
                background=True,
                fencing_token=fencing_token,
            ),
            token=token,
            kind=self._renew_kind,
            ttl_ms=config.ttl_ms,
            interval=config.renew_interval,
            due=due,
            stop_at=None if config.max_hold is None else sent_at + config.max_hold,
            rng=runtime.scheduler.rng,
            replicas=config.replicas,
            replica_timeout=config.replica_timeout,
        )

    # ----------------------------------------------------------------- compensations, release
    async def _abort(self, runtime: Runtime, token: str, *, timeout: float) -> None:
        """Undo an acquire whose outcome is unknown, under a shield; errors are dropped.

        If the key was set and this fails too, it expires within the ttl.
        """
        with contextlib.suppress(BackendError, TimeoutError):
            await run_shielded(
                self._release_token(runtime, token, abort=True, timeout=timeout),
                timeout=timeout + 0.1,
            )

    async def _withdraw_in_background(
        self, runtime: Runtime, queue: WaitQueue, *, timeout: float
    ) -> None:
        """Withdraw `queue` in a task of its own (its errors dropped), waiting only until
        the command is written (at most `timeout`): the caller has its lease and goes on,
        and a process that exits right after still leaves no entry behind."""
        loop = runtime.loop
        written = loop.create_future()

        def on_sent() -> None:
            if not written.done():
                written.set_result(None)

        async def withdraw() -> None:
            try:
                with contextlib.suppress(BackendError, TimeoutError):
                    await self._withdraw(runtime, queue, timeout=timeout, on_sent=on_sent)
            finally:
                on_sent()

        runtime.spawn(withdraw())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.shield(written)

    async def _withdraw(
        self,
        runtime: Runtime,
        queue: WaitQueue,
        *,
        timeout: float,
        on_sent: Callable[[], None] | None = None,
    ) -> None:
        """Take this process's wait queue out of Redis; pass on a reservation or grant made
        for it."""
        call = self._release_call(withdraw=queue.wid, claims=queue.claim_tokens())
        reply = await self._run_release(runtime, call, timeout=timeout, on_sent=on_sent)
        runtime.notifier.local_release(
            self._channel,
            f"w{queue.wid}",
            reply.handed_to,
            granted=reply.granted,
            seq=reply.seq,
            expiry_ms=reply.expiry_ms,
            slot=reply.slot,
            after=reply.after,
        )

    async def _release_token(
        self,
        runtime: Runtime,
        token: str,
        *,
        abort: bool,
        timeout: float,
        background: bool = False,
        fresh: bool = False,
        fencing_token: int | None = None,
        held_ms: int | None = None,
    ) -> int:
        """Run the release script for `token`: 1 released now, 2 already, 0 not the owner.

        `held_ms`, how long the lease was held, is recorded for the hold statistics.

        If this process has waiters for the name, their queue joins the queue in Redis in
        the same call (with a fresh registration), so the release can grant it straight to
        them. What the release did is told to them at once; if it may have freed it for
        them, the first of them is woken to try.
        """
        notifier = runtime.notifier
        channel = self._channel
        queue = None if abort else notifier.queue_for(channel)
        joining: tuple[WaitQueue, Registration] | None = None  # the queue this call puts in line
        join = None
        claims: list[str] = []
        sent_at = runtime.loop.time()
        if queue is not None and queue.waiters and not (queue.attempting or queue.joining):
            if not self._exclusive:
                # Leases granted to the queue's earlier registrations (heard of or not) are
                # given back by this call: the queue forgets them now, so that its head
                # cannot take one while the call is under way.
                claims = queue.give_back()
            registration = queue.register(self._grant_ms, sent_at)
            entry = self._entry(registration, task_name(queue.waiters[0].task))
            join = (queue.wid, entry, len(queue.waiters))
            joining = (queue, registration)
            queue.joining = True
        try:
            config = self._config
            call = self._release_call(
                token=token,
                retain_ms=config.abort_retain_ms if abort else config.retain_ms,
                held_ms=held_ms if config.hold_stats else None,
                renewed=config.renew_interval is not None,
                abort=abort,
                look_at_queue=config.serve_layout1,
                join=join,
                claims=claims,
            )
            reply = await self._run_release(
                runtime, call, timeout=timeout, background=background, fresh=fresh
            )
        except BaseException:
            if joining is not None:
                joining[0].joining = False
                joining[0].wake_head()  # whether it was put in line is unknown: the head tries
            raise
        status = reply.status
        if joining is not None:
            queue, registration = joining
            queue.joining = False
            if status == 1:
                queue.settle(registration, in_redis=True)
                queue.counted = join[2] if join is not None else None
            elif status == 0:
                queue.forget(registration)  # nothing was released, nor put in line
            # 2: an earlier attempt of this call released (and may have granted to this
            # registration): the head, woken below, claims such a grant with an acquire.
            if queue.waiters:
                queue.waiters[0].nudge()
            if notifier.queue_for(channel) is not queue:
                # Its waiters left while the release was in flight; their withdrawal may
                # have come first, and this release put the queue back: withdraw it again.
                with contextlib.suppress(BackendError, TimeoutError):
                    await self._withdraw(runtime, queue, timeout=timeout)
                return status
        if fencing_token is not None:
            if status == 1:
                notifier.local_release(
                    channel,
                    str(fencing_token),
                    reply.handed_to,
                    granted=reply.granted,
                    seq=reply.seq,
                    sent_at=sent_at,
                    expiry_ms=reply.expiry_ms,
                    slot=reply.slot,
                    after=reply.after,
                )
            else:  # released earlier (the answer was lost) or not ours: it may be free
                notifier.local_release(channel, str(fencing_token), "")
        return status

    async def _run_release(
        self,
        runtime: Runtime,
        call: Call,
        *,
        timeout: float,
        background: bool = False,
        fresh: bool = False,
        on_sent: Callable[[], None] | None = None,
    ) -> Released:
        """One release call, and what it did."""
        script, keys, args = call
        reply = await runtime.backend.run(
            script,
            keys,
            args,
            timeout=timeout,
            operation="release",
            name=self._name,
            background=background,
            fresh=fresh,
            on_sent=on_sent,
        )
        slot = text(reply[5]) if len(reply) > 5 else ""
        after = int(reply[6]) if len(reply) > 6 else -1
        return Released(
            int(reply[0]),
            text(reply[1]),
            text(reply[2]),
            text(reply[3]),
            int(reply[4]),
            slot,
            after,
        )

    def _granted(self, lease: Lease, waited: float, attempts: int) -> Lease:
        if events.enabled():
            events.emit(
                events.LockEvent(
                    kind=events.EventKind.ACQUIRED,
                    name=self._name,
                    fencing_token=lease.fencing_token,
                    wait=waited,
                    attempts=attempts,
                )
            )
        return lease

    def _timeout_error(
        self, timeout: float | None, waited: float, attempts: int, busy: Sequence[Any] = ()
    ) -> AcquireTimeoutError:
        holder, retry_after = _busy_hint(self._name, busy)
        if events.enabled():
            events.emit(
                events.LockEvent(
                    kind=events.EventKind.ACQUIRE_TIMED_OUT,
                    name=self._name,
                    wait=waited,
                    attempts=attempts,
                )
            )
        return AcquireTimeoutError(
            f"{self._what} {self._name!r} not acquired within {timeout or 0:g}s "
            f"(waited {waited:.3g}s, {attempts} attempts)",
            name=self._name,
            timeout=timeout or 0.0,
            waited=waited,
            attempts=attempts,
            holder=holder,
            retry_after=retry_after,
        )

    # ----------------------------------------------------------------- the LeaseIssuer side
    async def _extend_lease(self, lease: Lease, *, timeout: float, ttl_ms: int) -> bool:
        reply, acked = await self._run_waiting(
            runtime_for(self._client),
            self._renew_call(lease.token, ttl_ms),
            timeout=timeout,
            operation="extend",
        )
        if int(reply[0]) == 1:
            self._check_replicated("extend", acked)
        return int(reply[0]) == 1

    def _guarding(self, lease: Lease, task: asyncio.Task[Any], *, entered: bool) -> None:
        runtime_for(self._client).guard(self._key, task, entered=entered)

    async def _release_lease(self, lease: Lease, *, timeout: float) -> bool:
        runtime = runtime_for(self._client)
        held_ms = round(lease.held_for() * 1000)
        try:
            status = await self._release_token(
                runtime,
                lease.token,
                abort=False,
                timeout=timeout,
                # A lease of an event loop that was closed: the client's pooled connections
                # belong to that loop, so the release goes on a connection of this one.
                fresh=lease._loop is not runtime.loop,
                fencing_token=lease.fencing_token,
                held_ms=held_ms,
            )
        except BackendError as exc:
            if not migrating(exc):
                raise
            # Its cluster slot still migrates (a name's keys on both sides), refusing the
            # release: it goes on in the background, until the key would have expired
            # anyway (at most a ttl from now), and hands the lock on as soon as it is
            # applied. The holder is done with it.
            runtime.spawn(self._release_later(runtime, lease, held_ms))
            return True
        return status != 0

    async def _release_later(self, runtime: Runtime, lease: Lease, held_ms: int) -> None:
        with contextlib.suppress(BackendError, TimeoutError):
            await self._release_token(
                runtime,
                lease.token,
                abort=False,
                timeout=self._config.ttl,
                fencing_token=lease.fencing_token,
                held_ms=held_ms,
            )

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

        Cancellation:
            As for `acquire()`.
        """
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - asyncio always runs coroutines in a task
            raise RuntimeError(f"{type(self).__name__} must be used from an asyncio task")
        lease = await self.acquire()
        try:
            await lease.__aenter__()
        except BaseException:
            await lease._cleanup_after_loss()
            raise
        self._held.append((task, lease))
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the current task's lease; see `Lease.__aexit__` for what is raised."""
        task = asyncio.current_task()
        for index in range(len(self._held) - 1, -1, -1):
            if self._held[index][0] is task:
                lease = self._held.pop(index)[1]
                break
        else:
            raise RuntimeError(f"{self._what} {self._name!r} is not held by the current task")
        await lease.__aexit__(exc_type, exc, tb)
