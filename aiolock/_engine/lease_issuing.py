"""Leases: made from an acquire's answer or from a grant, and registered for renewal.

`LeaseIssuing`, an object each primitive holds, turns what Redis said into a `Lease` counted from when the request was sent,
registered with the client's `RenewalScheduler`; a lease taken from a grant heard of in
time gets its first renewal written before `acquire()` returns (or, with `replicas=N`,
confirmed by the replicas; with `renew_on_handoff=False`, left to the watchdog). Every
timing decision is the renewal policy's (`_model.renewal_policy`).
"""

from __future__ import annotations

import asyncio
import weakref

from .._model import renewal_policy as renewal
from .._transport.call_options import CallOptions
from ..errors import BackendError
from .lease import Lease
from .primitive_base import PrimitiveBase
from .release import ABORT_TIMEOUT, ReleasePath
from .runtime import Runtime
from .wait_queue import Grant, Registration, Released, WaitQueue
from .watchdog import RenewalEntry

__all__ = ("LeaseIssuing",)


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LeaseIssuing:
    """The lease side of one primitive (see the module docstring): its leases are the
    primitive's (their `LeaseIssuer`), released by its release path."""

    __slots__ = ("_of", "_release")

    def __init__(self, primitive: PrimitiveBase, release: ReleasePath) -> None:
        self._of = primitive
        self._release = release

    def new_lease(
        self,
        runtime: Runtime,
        token: str,
        fencing_token: int,
        sent_at: float,
        *,
        first_due: float | None,
        deadline: float | None = None,
        slot: int | None = None,
        permits: int = 1,
    ) -> Lease:
        """A lease under `token` (of `permits` permits, for a semaphore's), renewed from
        `first_due` on (None: not renewed)."""
        config = self._of._config
        return Lease(
            issuer=self._of,
            token=token,
            fencing_token=fencing_token,
            slot=slot,
            permits=permits,
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
                permits=permits,
            ),
        )

    def lease_from_grant(self, runtime: Runtime, grant: Grant) -> Lease | None:
        """The lease for a grant heard of in time, or None if it must first be claimed.

        The grant was made after `grant.sent_at` with its expiry (the full ttl when this
        process granted it to itself, else at most RESERVATION_MS), so the lease is valid
        until then, or for this primitive's ttl if that is shorter (its renewals set that),
        minus the margin. It is taken only with at least half of that left, and only by a
        primitive that renews. A lease valid for less than its ttl is renewed at once (see
        `_renew_granted`), and by the watchdog within a third of its validity. These are
        the renewal policy's decisions (`renewal.grant_timing`).
        """
        config = self._of._config
        timing = renewal.grant_timing(
            runtime.loop.time(),
            grant.sent_at,
            grant.expiry_ms,
            ttl=config.ttl,
            interval=config.renew_interval,
        )
        if timing is None:
            return None
        return self.new_lease(
            runtime,
            grant.registration.token,
            grant.fencing_token,
            grant.sent_at,
            first_due=timing.first_due,
            deadline=timing.deadline,
            slot=grant.slot,
        )

    def handed_over(self, runtime: Runtime, registration: Registration, reply: Released) -> None:
        """A release of this process handed its lease over to `registration` (for the ttl,
        its reply in hand): the lease goes to the first task here waiting without one (the
        queue in Redis is left as it was), or is released if none waits any more or the
        reply came too late to count on."""
        receiver = runtime.notifier.next_without(self._of._channel, None)
        slot = int(reply.slot) if reply.slot.isdigit() else None
        grant = Grant(registration, int(reply.granted), registration.sent_at, reply.expiry_ms, slot)
        lease = None if receiver is None else self.lease_from_grant(runtime, grant)
        if receiver is None or lease is None:
            self._release.give_back(runtime, registration)
            return
        receiver.hand(lease, more=reply.after > 0)

    async def take_grant(
        self, runtime: Runtime, queue: WaitQueue, grant: Grant, lease: Lease
    ) -> None:
        """The head takes `lease`, made from `grant`: the grant took the queue out of Redis
        (a next waiter puts it back, woken now if more may be free, else by the next
        release). Its first renewal is what the policy says (`renewal.first_renewal`):
        confirmed by the replicas (`replicas=N`), written before this returns (a grant
        shorter than the ttl, unless `renew_on_handoff=False`), or left to the watchdog.

        Cancellation:
            The lease never reaches the caller: it is released under a shield first.
        """
        queue.took(grant, requeued=self._of._requeued_on_grant and grant.requeued)
        config = self._of._config
        first = renewal.first_renewal(
            grant.expiry_ms,
            config.ttl_ms,
            replicas=config.replicas,
            at_once=config.renew_on_handoff,
        )
        if first is renewal.FirstRenewal.CONFIRMED:
            await self._confirm_granted(runtime, lease)
        elif first is renewal.FirstRenewal.WRITTEN:
            try:
                await self._renew_granted(runtime, lease)
            except asyncio.CancelledError:
                await lease._cleanup_after_loss()  # never reached its caller
                raise

    async def _renew_granted(self, runtime: Runtime, lease: Lease) -> None:
        """Renew a lease taken from a grant shorter than the ttl (another process's
        release) to its full ttl, before its body runs.

        The renewal is sent on the user's client now, in a task of its own; this waits
        until it has been written (never for its answer), so that an event-loop stall at
        the start of the body finds it confirmed by Redis, as a lease acquired with its
        full ttl would be: its reply, read when the loop runs again, counts (see `_aio.arrivals`).
        It is sent as EVAL, with the script's text: a server that does not know the script
        (restarted, flushed) runs it all the same, where EVALSHA's NOSCRIPT answer would
        make it go again only after the stall. Through a client on which aiolock cannot
        see when a command is written (`Backend.sees_writes`: fakeredis, say), its answer
        is awaited instead; on a cluster it goes through aiolock's own cluster client, as
        renewals do. Either wait lasts at most half of what the grant has left. The
        watchdog's own schedule goes on regardless.
        """
        config = self._of._config
        loop = runtime.loop
        entry = lease._entry
        if entry is None:
            return
        backend = runtime.backend
        # What this waits for: the renewal written (or its answer, on a client where aiolock
        # cannot see writes): one future, set by whichever comes first that counts.
        waited = loop.create_future()
        sees_writes = backend.sees_writes

        def on_sent() -> None:
            if sees_writes and not waited.done():
                waited.set_result(None)

        async def renew() -> None:
            sent_at = loop.time()
            lease._renewal_sent(sent_at, config.ttl)
            script, keys, args = self._of._renew_call(lease.token, config.ttl_ms, lease.permits)
            try:
                ours = await runtime.backend.run(
                    script,
                    keys,
                    args,
                    CallOptions(
                        timeout=max(lease.deadline - sent_at, 0.001),
                        operation="renew",
                        name=self._of._name,
                        on_sent=on_sent,
                        by_text=True,
                        background=backend.cluster,
                        votes=None if self._of._votes is None else self._of._votes.renew,
                    ),
                )
            except BackendError as exc:
                lease._renew_failed(exc)
                return
            finally:
                lease._renewal_answered(sent_at, config.ttl)
                if not waited.done():
                    waited.set_result(None)
            if not entry.active:
                # Released while the renewal was in flight (the body may start once it is
                # written): Redis may have run the release first, on another connection.
                # The token-guarded release decides whether the lease was kept.
                return
            if int(ours[0]) == 1:
                lease._renewed(sent_at, config.ttl)
                due = renewal.first_due(sent_at, config.renew_interval)
                if due is not None:
                    runtime.scheduler.postpone(entry, due)
            else:
                lease._not_owner()

        # Started at once (an eager task): the renewal is then written before this goes
        # on, and the body starts without waiting for the loop's next turns.
        runtime.spawn(renew(), eager=True)
        if waited.done():
            return
        # Bounded by a timer that ends the wait, rather than asyncio.timeout's cancellation.
        timer = loop.call_later(max(lease.deadline - loop.time(), 0) / 2, _done, waited)
        try:
            await waited
        finally:
            timer.cancel()

    async def _confirm_granted(self, runtime: Runtime, lease: Lease) -> None:
        """With `replicas=N`, a lease taken from a grant (written by a release, of this
        process or another) counts only once N replicas have it: its renewal to the full
        ttl is sent with a `WAIT`, and both answers are awaited before the body runs (one
        round trip). A grant that cannot be confirmed is released, and this raises.

        Cancellation:
            The lease never reaches the caller: it is released under a shield first.
        """
        config = self._of._config
        sent_at = runtime.loop.time()
        lease._renewal_sent(sent_at, config.ttl)
        try:
            reply, acked = await self._of._run_waiting(
                runtime,
                self._of._renew_call(lease.token, config.ttl_ms, lease.permits),
                timeout=max(lease.deadline - sent_at, 0.001),
                operation="acquire",
                votes=None if self._of._votes is None else self._of._votes.renew,
            )
        except BaseException:
            lease._renewal_answered(sent_at, config.ttl)
            await lease._cleanup_after_loss()
            raise
        lease._renewal_answered(sent_at, config.ttl)
        if int(reply[0]) != 1:
            lease._not_owner()
            raise lease.loss_error()
        if acked < config.replicas:
            await lease._cleanup_after_loss()
            self._of._check_replicated("acquire", acked)
        lease._renewed(sent_at, config.ttl)
        due = renewal.first_due(sent_at, config.renew_interval)
        if lease._entry is not None and due is not None:
            runtime.scheduler.postpone(lease._entry, due)

    def _renewal_entry(
        self,
        ref: weakref.ref[Lease],
        *,
        token: str,
        fencing_token: int,
        sent_at: float,
        due: float,
        runtime: Runtime,
        permits: int = 1,
    ) -> RenewalEntry:
        config = self._of._config
        assert config.renew_interval is not None
        return RenewalEntry(
            lease_ref=ref,
            key=self._of._key,
            release=lambda: self._release.release(
                runtime,
                token,
                abort=False,
                timeout=ABORT_TIMEOUT,
                background=True,
                fencing_token=fencing_token,
            ),
            token=token,
            kind=self._of._renewal_kind(fencing_token, permits),
            ttl_ms=config.ttl_ms,
            interval=config.renew_interval,
            due=due,
            stop_at=renewal.stop_at(sent_at, config.max_hold),
            rng=runtime.scheduler.rng,
            replicas=config.replicas,
            replica_timeout=config.replica_timeout,
        )
