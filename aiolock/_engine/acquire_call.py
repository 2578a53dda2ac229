"""One `acquire()` call, from start to lease: the story of one acquisition.

`AcquireCall` is made by `Primitive.acquire` for each call and holds what that call knows:
its bound and attempts (`_Progress`), its ticket in the process's order of callers, its
waiter once it queues. Read top to bottom, `run` is the contended path:

- the fast path: one attempt when no task of this process waits for the name (`first_try`);
- else the FIFO wait (`wait_in_line`): the process's `WaitQueue` (`_engine.wait_queue`),
  where only the head talks to Redis, trying with a fresh `Registration` per attempt
  (`try_as_head`) so that a release can grant the lock straight to this process; a grant
  heard of taken as a lease (the lease issuing's `take_grant`); sleeping until woken, or
  until the holder's key would expire (`sleep`: a fallback timer, as expiries send no
  notification), or the caller's timeout;
- a lease got by a later caller of this process while an earlier one waits, handed to it
  (`hand_to_earlier`);
- leaving (`leave`): a lease handed and not taken passed on, and the process's queue
  withdrawn from Redis (the release path's) when its last waiter leaves.

Each attempt is the primitive's (`Primitive._attempt`: one script call; a Redlock's tries
again after a vote no quorum decided); leases come from its lease issuing, and the
withdrawal from its release path: collaborators given to the call, not layers of a class.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Sequence
from typing import Any, Final, Protocol

from .._aio.backoff import Backoff, poll_delay
from .._aio.shielding import run_shielded
from .._model.config import REPLY_TIMEOUT
from .._transport.clients import migrating, stalled_for
from ..errors import AcquireTimeoutError, BackendError
from .lease import Lease
from .lease_issuing import LeaseIssuing
from .primitive_base import Attempt, PrimitiveBase
from .release import ReleasePath, cleanup_budget
from .runtime import Runtime
from .wait_queue import Waiter, WaitQueue

__all__ = (
    "MIGRATING_ATTEMPT_TIMEOUT",
    "MIN_ATTEMPT_TIMEOUT",
    "RECOUNT_DELAY",
    "AcquireCall",
    "Attempting",
)

MIN_ATTEMPT_TIMEOUT: Final = REPLY_TIMEOUT
"""Shortest time an acquire attempt gives Redis to answer (connecting included), unless a
primitive's `reply_timeout` says otherwise."""
RECOUNT_DELAY: Final = 0.05
"""How soon a waiting head writes its process's entry again after waiters joined or left
(several arriving at once are counted by one command)."""

MIGRATING_ATTEMPT_TIMEOUT: Final = 0.1
"""The least time an attempt is given once an earlier attempt of the same acquire met its
cluster slot migrating: a timed acquire then ends within its timeout and this."""


class Attempting(Protocol):
    """A primitive's attempt (`Primitive._attempt`): one acquire script call."""

    def __call__(
        self,
        runtime: Runtime,
        time_left: float | None,
        *,
        queue: WaitQueue | None = None,
        behind: int = 0,
        token: str | None = None,
        floor: float = MIN_ATTEMPT_TIMEOUT,
    ) -> Awaitable[Attempt]: ...


class _Progress:
    """One acquire() call's account: its bound, its attempts, what Redis last said, and how
    it ended (what its waiter's leaving must know)."""

    __slots__ = (
        "acquired",
        "attempts",
        "busy",
        "deadline",
        "loop",
        "migrating",
        "more",
        "pttl_ms",
        "reply_timeout",
        "started",
        "wait",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        wait: float | None,
        pttl_ms: int,
        reply_timeout: float = MIN_ATTEMPT_TIMEOUT,
    ) -> None:
        self.loop = loop
        self.reply_timeout = reply_timeout
        self.wait = wait
        self.started = loop.time()
        self.deadline = None if wait is None else self.started + wait
        self.attempts = 0
        # When to check again unless told of a release: the holder's remaining ttl as last
        # told, or sooner (`check_within_ms`); <= 0: unknown.
        self.pttl_ms = pttl_ms
        self.busy: Sequence[Any] = ()  # the last answer "held"
        self.acquired = False
        self.more = False  # leases may still be free for the next waiter here (a semaphore)
        self.migrating = False  # an attempt met its cluster slot migrating

    def floor(self) -> float:
        """The least time an attempt is given, past the timeout too (the primitive's
        `reply_timeout`): less once the slot was found migrating (a retry then would
        outlast the timeout by a whole window)."""
        if self.migrating:
            return min(MIGRATING_ATTEMPT_TIMEOUT, self.reply_timeout)
        return self.reply_timeout

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.loop.time()

    def waited(self) -> float:
        return self.loop.time() - self.started

    def refused(self, attempt: Attempt, *, keep_busy: bool = False) -> None:
        """An attempt found it held: remember when it may be free, and by whom."""
        self.pttl_ms = attempt.pttl_ms
        self.busy = (attempt.busy or self.busy) if keep_busy else attempt.busy

    def took(self, *, more: bool) -> None:
        """The waiter got its lease (`more`: the next waiter may get one too)."""
        self.acquired, self.more = True, more


class AcquireCall:
    """One `acquire()` call of a primitive (see the module docstring)."""

    __slots__ = ("_attempt", "leases", "of", "progress", "release", "runtime", "token", "wait")

    def __init__(
        self,
        primitive: PrimitiveBase,
        runtime: Runtime,
        *,
        wait: float | None,
        token: str | None,
        attempt: Attempting,
        leases: LeaseIssuing,
        release: ReleasePath,
    ) -> None:
        """`wait`: the caller's timeout (None: for ever, 0: one try); `token`: the caller's
        own, or None; `attempt`, `leases`, `release`: the primitive's attempt and
        collaborators."""
        self.of, self.runtime = primitive, runtime
        self.wait, self.token = wait, token
        self._attempt, self.leases, self.release = attempt, leases, release
        config = primitive._config
        self.progress = _Progress(runtime.loop, wait, config.ttl_ms, config.reply_timeout)

    async def run(self) -> Lease:
        """The lease, or `AcquireTimeoutError` (see `Primitive.acquire`)."""
        progress, notifier, channel = self.progress, self.runtime.notifier, self.of._channel
        # The tasks of this process that wait are served in the order they called; a lease
        # that a later caller gets while an earlier one waits goes to the earlier one.
        ticket = notifier.ticket()
        orderly = self.wait != 0 and self.token is None
        handed_on = False
        # Fast path: nobody of this process is queued, so try before subscribing (several
        # tasks may try at once). Otherwise queue behind them (first come, first served),
        # unless this is a single try.
        if self.wait == 0 or notifier.queue_length(channel) == 0:
            lease = await self.first_try(ticket, orderly=orderly)
            if lease is not None:
                if not (orderly and await self.hand_to_earlier(lease, ticket)):
                    return self.of._granted(lease, progress.waited(), progress.attempts)
                handed_on = True
        if self.wait == 0:
            raise self.timed_out()
        # (A refused first try joins in the same step as it ends: whoever waits for it to
        # be answered finds it in the queue.)
        waiter = notifier.join(
            channel, ticket, accepts=self.token is None, direct=self.of._direct_grants
        )
        notifier.end_try(channel, ticket)
        try:
            await notifier.ready(waiter, timeout=progress.time_left())
            must_try = waiter.is_head and not handed_on
            return await self.wait_in_line(waiter, must_try=must_try)
        finally:
            await self.leave(waiter)

    async def first_try(self, ticket: int, *, orderly: bool) -> Lease | None:
        """The fast path's one attempt: the lease, or None (refused: its try stays in
        flight, for the caller to end once it has joined the queue)."""
        progress, notifier, channel = self.progress, self.runtime.notifier, self.of._channel
        progress.attempts += 1
        if orderly:
            notifier.start_try(channel, ticket)
        try:
            attempt = await self._attempt(
                self.runtime, progress.time_left(), token=self.token, floor=progress.floor()
            )
        except BackendError as exc:
            if not (migrating(exc) or stalled_for(exc)):
                if orderly:
                    notifier.end_try(channel, ticket)
                raise
            progress.migrating = progress.migrating or migrating(exc)
            # Its cluster slot migrates, or a stall of this process spent its time (given
            # back, see `Primitive._attempt`): wait, as for a holder.
            attempt = Attempt(None, -1)
        except BaseException:
            if orderly:
                notifier.end_try(channel, ticket)
            raise
        if attempt.lease is None:
            progress.refused(attempt)
        elif orderly:
            notifier.end_try(channel, ticket)
        return attempt.lease

    async def wait_in_line(self, waiter: Waiter, *, must_try: bool) -> Lease:
        """Wait in the process's queue until `waiter` gets a lease: handed by a later caller,
        granted by a release, or got by its own attempt as the head."""
        progress, runtime, queue = self.progress, self.runtime, waiter.queue
        notifier, channel, granted = runtime.notifier, self.of._channel, self.of._granted
        exclusive = self.of._exclusive
        trying_before, rng = notifier.trying_before, notifier.rng
        unknown_pttl = Backoff(base=0.01, cap=1.0, rng=rng)
        while True:
            if waiter.handed is not None:
                # Handed by a task of this process that called later and got a lease, or
                # by a release's hand-over.
                progress.took(more=not exclusive and waiter.handed_more)
                return granted(_take_handed(waiter), progress.waited(), progress.attempts)
            if waiter.is_head and (queue.attempting or trying_before(channel, waiter.ticket)):
                # An earlier caller's first try is in flight: if refused, it queues ahead
                # of this one (which is nudged when it is answered).
                await self.wait_turn(waiter)
                continue
            if waiter.is_head and (grant := queue.pop_grant()) is not None:
                # A lease under the caller's own token claims the grant by an acquire.
                lease = None
                if self.token is None:
                    lease = self.leases.lease_from_grant(runtime, grant)
                if lease is None:
                    must_try = True  # heard of too late to count on: claim it by an acquire
                else:
                    await self.leases.take_grant(runtime, queue, grant, lease)
                    if not await self.keep_or_hand(lease, waiter):
                        progress.took(more=not exclusive and grant.more)
                        return granted(lease, progress.waited(), progress.attempts)
                    continue
            if waiter.is_head and queue.joining:
                # A release here is putting the queue in line: its answer comes first (it
                # nudges the head), unless the caller's timeout comes before it.
                await self.wait_turn(waiter)
                continue
            if waiter.is_head and (waiter.take_wakeup() or must_try):
                must_try = False
                attempt = await self.try_as_head(queue)
                if attempt.lease is not None:
                    if not await self.keep_or_hand(attempt.lease, waiter):
                        progress.took(more=attempt.free > 0)
                        return granted(attempt.lease, progress.waited(), progress.attempts)
                    continue
            if await self.sleep(waiter, unknown_pttl, rng):
                must_try = True

    async def wait_turn(self, waiter: Waiter) -> None:
        """The head waits for a command of its queue in flight to be answered (it is
        nudged then), or for the caller's timeout, which raises."""
        remaining = self.progress.time_left()
        if remaining is not None and remaining <= 0:
            raise self.timed_out()
        await waiter.wait(remaining, pending_ok=True)

    async def try_as_head(self, queue: WaitQueue) -> Attempt:
        """The head's attempt, which puts the process in line with a fresh registration."""
        progress = self.progress
        progress.attempts += 1
        try:
            attempt = await self._attempt(
                self.runtime,
                progress.time_left(),
                queue=queue,
                behind=len(queue.waiters) - 1,
                token=self.token,
                floor=progress.floor(),
            )
        except BackendError as exc:
            if not (migrating(exc) or stalled_for(exc)):
                raise
            progress.migrating = progress.migrating or migrating(exc)
            # Its cluster slot migrates (a name's keys on both sides): nothing was applied;
            # or a stall of this process spent its time (given back, see `_attempt`): try
            # again after a pause, as for an unknown expiry.
            attempt = Attempt(None, -1)
        if attempt.lease is None:
            progress.refused(attempt, keep_busy=True)
        return attempt

    async def sleep(self, waiter: Waiter, unknown_pttl: Backoff, rng: random.Random) -> bool:
        """Sleep until woken, nudged, or (the head) until the holder's key would expire;
        True if the head's timer ran out (it tries). Raises at the caller's timeout."""
        progress = self.progress
        remaining = progress.time_left()
        if remaining is not None and remaining <= 0:
            raise self.timed_out()
        delay = remaining
        if waiter.is_head:
            hint = waiter.take_poll_hint()
            if hint is not None:  # told while it tried: the sooner check counts
                progress.pttl_ms = min(progress.pttl_ms, hint) if progress.pttl_ms > 0 else hint
            # The backoff only paces checks of a key whose expiry is unknown.
            pttl_ms = progress.pttl_ms
            fallback = unknown_pttl.next() if pttl_ms <= 0 else 0.0
            poll = poll_delay(pttl_ms, fallback=fallback, rng=rng)
            if self.of._max_poll is not None:
                poll = min(poll, self.of._max_poll)
            if waiter.queue.miscounted:
                poll = min(poll, RECOUNT_DELAY)  # the next try writes the count
            delay = poll if remaining is None else min(poll, remaining)
        # A wake-up pending for a waiter that is no longer the head (an earlier caller
        # queued ahead of it) waits until it is the head again.
        timed_out = await waiter.wait(delay, pending_ok=not waiter.is_head)
        waiter.check()
        hint = waiter.take_poll_hint()
        if hint is not None:  # the lock was handed to another process
            progress.pttl_ms = hint
        return timed_out and waiter.is_head

    async def leave(self, waiter: Waiter) -> None:
        """`waiter` leaves the queue, however its wait ended; the last of this process
        takes the queue out of Redis."""
        progress, runtime = self.progress, self.runtime
        if waiter.handed is not None:
            # Handed a lease it did not take (it timed out, or was cancelled): the next
            # waiter takes it, or it is released.
            self.pass_on(_take_handed(waiter), but=waiter)
        leaving = runtime.notifier.leave(waiter, acquired=progress.acquired, more=progress.more)
        if leaving is None:
            return
        # The last waiter of this process left: take its queue out of Redis, and hand on a
        # lock reserved or granted to it meanwhile (after an acquire, in the background:
        # the caller has its lease).
        budget = cleanup_budget(progress.time_left())
        if progress.acquired:
            await self.release.withdraw_in_background(runtime, leaving, timeout=budget)
        else:
            with contextlib.suppress(BackendError, TimeoutError):
                await run_shielded(
                    self.release.withdraw(runtime, leaving, timeout=budget),
                    timeout=budget + 0.1,
                )

    def timed_out(self) -> AcquireTimeoutError:
        progress = self.progress
        return self.of._timeout_error(
            progress.wait,
            progress.waited(),
            progress.attempts,
            progress.busy,
            migrating=progress.migrating,
        )

    async def hand_to_earlier(self, lease: Lease, ticket: int) -> bool:
        """Hand `lease`, which the acquire() call `ticket` got, to the waiter of an earlier
        call of this process, if one waits for it (once the first tries of earlier calls
        in flight are answered: a refused one queues). True if it was handed on.

        Cancellation:
            The lease never reaches a caller: it is released under a shield first.
        """
        notifier, channel = self.runtime.notifier, self.of._channel
        if notifier.trying_before(channel, ticket):
            try:
                await notifier.tries_before(channel, ticket)
            except BaseException:
                await lease._cleanup_after_loss()
                raise
        receiver = notifier.first_before(channel, ticket)
        if receiver is None:
            return False
        receiver.hand(lease)
        return True

    async def keep_or_hand(self, lease: Lease, waiter: Waiter) -> bool:
        """A waiter got `lease`: False if it keeps it, True if it went to another waiter
        (one of an earlier call, or any other if this one was handed a lease meanwhile)."""
        if waiter.handed is not None:
            self.pass_on(lease, but=waiter)
            return True
        return await self.hand_to_earlier(lease, waiter.ticket)

    def pass_on(self, lease: Lease, *, but: Waiter) -> None:
        """Give a lease nobody here took to the first waiter without one, or release it."""
        receiver = self.runtime.notifier.next_without(self.of._channel, but)
        if receiver is not None:
            receiver.hand(lease)
        else:
            self.runtime.spawn(lease._cleanup_after_loss())


def _take_handed(waiter: Waiter) -> Lease:
    lease = waiter.take_handed()
    assert isinstance(lease, Lease)
    return lease
