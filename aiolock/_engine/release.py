"""The release path of every leased primitive, and the compensations of a failed acquire.

`ReleasePath`, an object each primitive holds, runs the token-guarded release (putting this
process's own waiters in line in the same call, and telling them at once what it did), the
withdrawal of this process's wait queue from Redis when its last waiter leaves, and the
abort of an acquire whose outcome is unknown (a release that also forbids that acquire from
landing later). It makes the primitive's release calls (`PrimitiveBase._release_call`,
`_run_release`); a lease a release hands over to a task of this process goes where the
primitive says (`hand_over`: the lease issuing's).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from typing import Final

from .._aio.shielding import run_shielded
from .._lua.lock import Join
from .._model.config import check_token
from .._model.holder import task_name
from .._transport.clients import migrating
from ..errors import BackendError
from .lease import Lease
from .primitive_base import PrimitiveBase
from .runtime import Runtime, runtime_for
from .wait_queue import Registration, Released, WaitQueue

__all__ = ("ABORT_TIMEOUT", "MIN_CLEANUP", "HandOver", "ReleasePath", "cleanup_budget")

MIN_CLEANUP: Final = 0.1
"""Shortest time given to a cleanup, even when the caller's timeout is used up."""
ABORT_TIMEOUT: Final = 1.0
"""Longest wait for the cleanup of an acquire whose outcome is unknown."""


async def _until(done: asyncio.Future[None]) -> None:
    """Wait for `done` without cancelling it when this wait is cancelled."""
    await asyncio.shield(done)


def cleanup_budget(time_left: float | None) -> float:
    """How long a cleanup after a failed or abandoned wait may take: what is left of the
    caller's timeout (at least a moment, to try), at most ABORT_TIMEOUT."""
    if time_left is None:
        return ABORT_TIMEOUT
    return min(ABORT_TIMEOUT, max(time_left, MIN_CLEANUP))


HandOver = Callable[[Runtime, Registration, Released], None]
"""Where a lease that a release handed over to a token of this process goes."""


class ReleasePath:
    """The release side of one primitive (see the module docstring)."""

    __slots__ = ("_hand_over", "_of")

    def __init__(self, primitive: PrimitiveBase, *, hand_over: HandOver | None = None) -> None:
        """`hand_over`: what becomes of a lease a release handed over to a token of this
        process (a waiting task takes it); without it, it is given back."""
        self._of = primitive
        self._hand_over = hand_over

    async def release_token(self, token: str) -> bool:
        """`Primitive.release_token`: the release of `token`, from any process, under a
        shield; whether it was released (now or earlier)."""
        token = check_token(token)
        runtime = runtime_for(self._of._client)
        status = await run_shielded(
            self.release(runtime, token, abort=False, timeout=ABORT_TIMEOUT * 5),
            timeout=ABORT_TIMEOUT * 5 + 0.5,
        )
        return status != 0

    async def abort(self, runtime: Runtime, token: str, *, timeout: float) -> None:
        """Undo an acquire whose outcome is unknown: a release in abort mode, in a task of
        its own bounded by ABORT_TIMEOUT, its errors dropped. The caller waits for it at
        most `timeout` (what its own timeout leaves, see `cleanup_budget`); past that the
        abort goes on without it, so that a caller whose time is used up (its acquire's
        reply lost, a connection to make again) does not leave the key set for its ttl;
        such an abort goes on a connection of its own, closed when it ends.
        If the abort fails too, the key expires within the ttl.

        Cancellation:
            Cancelling the caller does not stop the abort; the caller still waits for it
            up to `timeout`, then the cancellation propagates.
        """
        # An abort that may outlive its caller goes on a connection of its own, closed when
        # it ends: the caller may close its client meanwhile.
        fresh = timeout < ABORT_TIMEOUT

        async def abort() -> None:
            with contextlib.suppress(BackendError, TimeoutError):
                await self.release(runtime, token, abort=True, timeout=ABORT_TIMEOUT, fresh=fresh)

        aborting = runtime.spawn(abort())
        with contextlib.suppress(TimeoutError):
            await run_shielded(_until(aborting), timeout=timeout)

    async def withdraw_in_background(
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
                    await self.withdraw(runtime, queue, timeout=timeout, on_sent=on_sent)
            finally:
                on_sent()

        runtime.spawn(withdraw())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.shield(written)

    async def withdraw(
        self,
        runtime: Runtime,
        queue: WaitQueue,
        *,
        timeout: float,
        on_sent: Callable[[], None] | None = None,
    ) -> None:
        """Take this process's wait queue out of Redis; pass on a reservation or grant made
        for it. Nothing for a primitive whose waiters are not queued in Redis."""
        if not self._of._queued_in_redis:
            return
        call = self._of._release_call(withdraw=queue.wid, claims=queue.claim_tokens())
        reply = await self._of._run_release(runtime, call, timeout=timeout, on_sent=on_sent)
        runtime.notifier.local_release(
            self._of._channel,
            f"w{queue.wid}",
            reply.handed_to,
            granted=reply.granted,
            seq=reply.seq,
            expiry_ms=reply.expiry_ms,
            slot=reply.slot,
            after=reply.after,
        )

    async def release(
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
        them, the first of them is woken to try. While another command puts their queue in
        line, a primitive that `_hands_over` has the release hand its lease straight to one
        of them instead, under a fresh token, if no other process is ahead of them.
        """
        notifier = runtime.notifier
        channel = self._of._channel
        queue = None if abort else notifier.queue_for(channel)
        # The queue this call puts in line, its registration and the waiters it counts:
        joining: tuple[WaitQueue, Registration, int] | None = None
        handing: Registration | None = None  # the token of a hand-over
        join: Join | None = None
        claims: list[str] = []
        sent_at = runtime.loop.time()
        if queue is not None and queue.can_join:
            # A primitive with several leases gives back, in this call, what was granted to
            # the queue's earlier registrations (heard of or not).
            claims, registration = queue.joining_started(
                self._of._grant_ms, sent_at, give_back=not self._of._exclusive
            )
            join = self._join(queue, registration, len(queue.waiters), sent_at)
            joining = (queue, registration, join[2])
        elif queue is not None and self._may_hand_over(runtime):
            handing = Registration(0, secrets.token_hex(16), sent_at, self._of._grant_ms)
            join = self._join(queue, handing, 0, sent_at)
        try:
            config = self._of._config
            call = self._of._release_call(
                token=token,
                retain_ms=config.abort_retain_ms if abort else config.retain_ms,
                held_ms=held_ms if config.hold_stats else None,
                renewed=config.renew_interval is not None,
                abort=abort,
                look_at_queue=config.serve_layout1,
                join=join,
                claims=claims,
            )
            reply = await self._of._run_release(
                runtime, call, timeout=timeout, background=background, fresh=fresh
            )
        except BaseException:
            if joining is not None:
                joining[0].joining_failed()
            if handing is not None:  # it may have been applied: a lease nobody would own
                self.give_back(runtime, handing)
            raise
        status = reply.status
        if handing is not None:
            if status == 1 and reply.seq == "0" and reply.granted:
                self._handed_over(runtime, handing, reply)
                return status
            if status == 2:  # an earlier copy of this call released: it may have handed over
                self.give_back(runtime, handing)
        if joining is not None:
            queue, registration, count = joining
            queue.joining_answered(registration, status, count)
            if notifier.queue_for(channel) is not queue:
                # Its waiters left while the release was in flight; their withdrawal may
                # have come first, and this release put the queue back: withdraw it again.
                with contextlib.suppress(BackendError, TimeoutError):
                    await self.withdraw(runtime, queue, timeout=timeout)
                return status
        if status == 1 or fencing_token is not None:
            # A release by token does not know the fencing token it released: the start of
            # its token (never the whole secret) tells the release apart from others (and
            # from its echo, which is only a nudge).
            fence = f"t{token[:16]}" if fencing_token is None else str(fencing_token)
            if status == 1:
                notifier.local_release(
                    channel,
                    fence,
                    reply.handed_to,
                    granted=reply.granted,
                    seq=reply.seq,
                    sent_at=sent_at,
                    expiry_ms=reply.expiry_ms,
                    slot=reply.slot,
                    after=reply.after,
                )
            else:  # released earlier (the answer was lost) or not ours: it may be free
                notifier.local_release(channel, fence, "")
        return status

    def _join(
        self, queue: WaitQueue, registration: Registration, count: int, sent_at: float
    ) -> Join:
        """The release's `join` of the process's queue under `registration`, counting
        `count` waiters: with how long its oldest waiter has waited, in µs, where the
        primitive serves the oldest waiter first."""
        head = queue.waiters[0]
        entry = self._of._entry(registration, task_name(head.task))
        if not self._of._oldest_first:
            return (queue.wid, entry, count)
        return (queue.wid, entry, count, max(int((sent_at - head.since) * 1e6), 0))

    def _may_hand_over(self, runtime: Runtime) -> bool:
        """Whether a release may hand its lease over to a task of this process now: the
        primitive does, without replicas to confirm a lease (a hand-over is not followed
        by a WAIT), and a task waits that would take it."""
        return (
            self._of._hands_over
            and not self._of._config.replicas
            and runtime.notifier.next_without(self._of._channel, None) is not None
        )

    def _handed_over(self, runtime: Runtime, registration: Registration, reply: Released) -> None:
        """A release handed its lease over to `registration`, a token of this process: it
        goes where the primitive says (`hand_over`), else it is given back."""
        if self._hand_over is None:
            self.give_back(runtime, registration)
        else:
            self._hand_over(runtime, registration, reply)

    def give_back(self, runtime: Runtime, registration: Registration) -> None:
        """Abort, in the background, a lease that may be held under `registration` (a
        hand-over nobody here takes, or whose outcome is unknown): it is released if it
        was granted, and can never be granted later."""
        runtime.spawn(self.abort(runtime, registration.token, timeout=ABORT_TIMEOUT))

    async def release_lease(self, lease: Lease, *, timeout: float) -> bool:
        """Release `lease` (the `LeaseIssuer`'s release): whether it was still this
        lease's; a release its migrating cluster slot refuses goes on in the background."""
        runtime = runtime_for(self._of._client)
        held_ms = round(lease.held_for() * 1000)
        try:
            status = await self.release(
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
            await self.release(
                runtime,
                lease.token,
                abort=False,
                timeout=self._of._config.ttl,
                fencing_token=lease.fencing_token,
                held_ms=held_ms,
            )
