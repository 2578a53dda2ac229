"""The wait queue of one lock name in this process: its waiters, first come first served,
and what this process has in the lock's queue in Redis.

Only the waiter at the head of a queue talks to Redis: a release wakes the head alone, and
the others wait their turn without sending anything, so many waiters on one key cost Redis
one attempt per release per process, not one per waiter.

Direct grants: each queue entry in Redis carries a fresh token registered by this process
(a `Registration`). A release grants the lock to the first live entry's token, so the head
of that process's queue holds the lock as soon as it hears of the grant, with no acquire
round trip. It counts its validity from when the registration was sent (the grant came
later), so a grant heard too late is confirmed by an acquire that claims it instead.

Every change of the queue's state is a method named for what happens: an attempt carrying
a registration starts and is answered (`attempt_started`, `attempt_answered`,
`attempt_ended`), a local release puts the queue in line (`joining_started`,
`joining_answered`, `joining_failed`), a grant is heard of (`released`) and taken (`took`).
At most one command carrying a registration is in flight, so that Redis applies them in
the order they were made. The pub/sub side (`_engine.notifier`) tells the queue what it hears.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import secrets
from dataclasses import dataclass
from typing import Final

from .._aio.backoff import POLL_SPREAD
from .._lua.layout import RESERVATION_MS
from ..errors import BackendError

__all__ = ("Grant", "Registration", "Released", "WaitQueue", "Waiter")

MAX_REGISTRATIONS: Final = 4
"""Registrations a queue remembers while their fate is unknown (a cancelled or failed
attempt may or may not have put one in Redis). A grant to a forgotten one lapses after
RESERVATION_MS."""


@dataclass(frozen=True, slots=True)
class Registration:
    """A token this process put in a lock's queue in Redis, for the lock to be granted to."""

    seq: int
    token: str
    sent_at: float  # local time the command carrying it was sent: before any grant to it
    grant_ms: int  # how long a grant to it is held before it must be renewed


@dataclass(frozen=True, slots=True)
class Released:
    """What one release call did (see RELEASE in `_lua.lock`)."""

    status: int  # 1 released now, 2 already, 3 a queue withdrawn, 0 not the owner
    handed_to: str  # the wait queue the lock was handed to, or ''
    granted: str  # the fencing token it was granted under, or ''
    seq: str  # the registration it was granted to, or ''
    expiry_ms: int  # the grant's expiry, or 0
    slot: str = ""  # the slot of a permit granted, or ''
    after: int = -1  # a semaphore's grant to the caller's queue: permits left free, -1 requeued


@dataclass(frozen=True, slots=True)
class Grant:
    """The lock was granted to one of this queue's registrations."""

    registration: Registration
    fencing_token: int
    sent_at: float  # latest local time known to precede the grant
    expiry_ms: int  # the expiry the grant set on the key
    slot: int | None = None  # the slot of a semaphore's permit
    # What the grant left (a semaphore's, told by its release's reply): whether the queue
    # was put back in line without a token, and whether more may be free for the next
    # waiter. Unknown (a grant heard on the channel): both.
    requeued: bool = True
    more: bool = True

    def valid_until(self, validity: float, margin: float) -> float:
        return self.sent_at + validity - margin


class Waiter:
    """One task's place in a `WaitQueue`."""

    __slots__ = (
        "_future",
        "_time_up",
        "_try_now",
        "_until",
        "accepts",
        "handed",
        "handed_more",
        "poll_hint_ms",
        "queue",
        "since",
        "task",
        "ticket",
    )

    def __init__(self, queue: WaitQueue, ticket: int, *, accepts: bool = True) -> None:
        self.queue = queue
        self.task = asyncio.current_task()
        self.ticket = ticket  # the order of its acquire() call among the process's calls
        self.since = asyncio.get_running_loop().time()  # when it began to wait
        self.accepts = accepts  # takes a lease another task got (not under its own token)
        self._future: asyncio.Future[None] | None = None
        self._time_up = False  # the timeout of the wait in progress passed
        self._try_now = False
        self._until: float | None = None  # when the timer of the wait in progress ends it
        self.poll_hint_ms: int | None = None  # when to check next, if told by a notification
        # A lease another task of this process got, and handed to this one (which called
        # acquire() first): the engine's `Lease`, taken by the waiter's acquire.
        self.handed: object | None = None
        self.handed_more = True  # whether more leases may be free for the next waiter

    def hand(self, lease: object, *, more: bool = True) -> None:
        """Give this waiter a lease that another task of the process got (`more`: leases
        may still be free for the next waiter)."""
        self.handed, self.handed_more = lease, more
        self.nudge()

    @property
    def is_head(self) -> bool:
        return bool(self.queue.waiters) and self.queue.waiters[0] is self

    def wake(self) -> None:
        """Ask this waiter to try to acquire now (or as soon as it next waits)."""
        self._try_now = True
        self.nudge()

    def nudge(self) -> None:
        """Make a sleeping waiter re-evaluate its wait (it became head) without trying."""
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    def take_poll_hint(self) -> int | None:
        """Consume the hint a notification left (the lock was handed to another process:
        check again once that grant would have lapsed), if any: milliseconds."""
        hint, self.poll_hint_ms = self.poll_hint_ms, None
        return hint

    def take_handed(self) -> object | None:
        """Consume the lease handed to this waiter, if any."""
        lease, self.handed = self.handed, None
        return lease

    def take_wakeup(self) -> bool:
        """Consume a pending "try now": True if there was one."""
        pending, self._try_now = self._try_now, False
        return pending

    def check(self) -> None:
        """Raise `BackendError` if notifications for this queue were refused by the server."""
        refusal = self.queue.refusal
        if refusal is not None:
            raise BackendError(
                f"subscription to {self.queue.channel!r} was refused: {refusal}",
                operation="subscribe",
                name=None,
            ) from refusal

    async def wait(self, timeout: float | None, *, pending_ok: bool = False) -> bool:
        """Sleep until woken, nudged, or `timeout` passes; True if the timeout passed.

        Returns at once if a lease was handed to it (while it was busy elsewhere: trying,
        say), or if a wake-up is pending, unless `pending_ok` (it stays pending).
        """
        if self.handed is not None or (self._try_now and not pending_ok):
            return False
        loop = asyncio.get_running_loop()
        self._future = loop.create_future()
        self._time_up = False
        # A timer that ends the wait, rather than asyncio.timeout's cancellation of the task.
        timer = None if timeout is None else loop.call_later(timeout, self._timeout_passed)
        # (not timer.when(): uvloop gives a plain Handle for a delay of 0 or less)
        self._until = None if timeout is None else loop.time() + timeout
        try:
            await self._future
        finally:
            self._future = None
            self._until = None
            if timer is not None:
                timer.cancel()
        return self._time_up

    def checks_within(self, seconds: float) -> bool:
        """Whether this waiter sleeps now, and its own timer ends the sleep within
        `seconds` from now."""
        until = self._until
        return until is not None and until <= asyncio.get_running_loop().time() + seconds

    def _timeout_passed(self) -> None:
        """The timeout of the wait in progress passed (before the waiter went on: then it
        counts even if it was woken or nudged in the meantime, as a cancellation by
        asyncio.timeout would)."""
        self._time_up = True
        self.nudge()


class WaitQueue:
    """The waiters of one lock name in this process, first come first served."""

    __slots__ = (
        "_granted",
        "_heard",
        "_newest",
        "_recent",
        "_seq",
        "_spent",
        "attempting",
        "channel",
        "channels",
        "counted",
        "grant",
        "joining",
        "reconnected",
        "refusal",
        "registrations",
        "requested",
        "requeued",
        "subscribed",
        "waiters",
        "wid",
    )

    def __init__(self, channel: str, direct: str | None = None) -> None:
        self.channel = channel
        # This queue's id in the lock's queue in Redis. With `direct` (its process's
        # channel id, "p" and 8 hex digits: see DIRECT_PREFIX), grants to it are told on the
        # channel `<channel>:<direct>` (and now and then on the name's channel too).
        self.wid = secrets.token_hex(8) if direct is None else direct + secrets.token_hex(4)
        # The channels it listens on, the one whose subscription makes it subscribed last.
        self.channels = (channel,) if direct is None else (channel, f"{channel}:{direct}")
        # Registrations that may be in Redis, oldest first; a grant is only ever to one.
        self.registrations: collections.deque[Registration] = collections.deque(
            maxlen=MAX_REGISTRATIONS
        )
        self._seq = itertools.count(1)
        self._spent = 0  # the highest registration whose grant a waiter took
        self.grant: Grant | None = None  # heard of, not yet taken by the head
        # Put back in line by the grant the head took, under no registration (a semaphore's).
        self.requeued = False
        # At most one command carrying a registration is in flight, so that Redis applies
        # them in the order they were made: the head's acquire, or a local release that
        # puts the queue in line. Read anywhere, changed only by the methods below.
        self.attempting = False  # the head's attempt carrying a registration
        self.joining = False  # a release of this process putting the queue in line
        # The number of waiters the queue's entry in Redis was last written with (None: no
        # entry, or not known): the head writes it again when the number here differs.
        self.counted: int | None = None
        self.reconnected = False  # lost its subscription: wake the head when it is back
        self.waiters: collections.deque[Waiter] = collections.deque()
        self.subscribed = asyncio.Event()  # set once subscribed, or once refused
        self.requested = False  # SUBSCRIBE sent on the current connection
        self.refusal: Exception | None = None
        self._recent: collections.deque[str] = collections.deque(maxlen=8)
        # Fencing tokens of the grants to this queue heard of: the channel and a release's
        # reply may both tell of one.
        self._granted: collections.deque[str] = collections.deque(maxlen=8)
        # A quorum's releases as each node announced them (fencing token, node), and the
        # newest fencing token of a lease taken here (see `announced`).
        self._heard: collections.deque[tuple[str, int]] = collections.deque(maxlen=64)
        self._newest = -1

    @property
    def registered(self) -> bool:
        """Whether the queue may have an entry in Redis: every command that writes one
        carries a registration, and each is kept until it is known not to be there; a
        grant that put the queue back in line leaves one with none."""
        return bool(self.registrations) or self.requeued

    @property
    def can_join(self) -> bool:
        """Whether a release of this process may put the queue in line now: someone waits,
        and no other command carrying a registration is in flight."""
        return bool(self.waiters) and not (self.attempting or self.joining)

    def nudge_head(self) -> None:
        if self.waiters:
            self.waiters[0].nudge()

    def wake_head(self) -> None:
        if self.waiters:
            self.waiters[0].wake()

    def register(self, grant_ms: int, sent_at: float) -> Registration:
        """A new token for the queue's entry in Redis; sent by the caller right away."""
        registration = Registration(next(self._seq), secrets.token_hex(16), sent_at, grant_ms)
        self.registrations.append(registration)
        return registration

    def settle(self, registration: Registration, *, in_redis: bool) -> None:
        """A command carrying `registration` (the newest) was answered, and applied.

        Older registrations are dead: the entry in Redis now holds the new one, and the
        command claimed or gave back any grant to them. The new one is in Redis only if
        `in_redis`; a grant to it may already have been heard of (a semaphore's acquire may
        grant the permits left to its own queue's new entry).
        """
        self.registrations.clear()
        self.requeued = False
        if in_redis and registration.seq > self._spent:
            # (a grant to it may already have been taken, if the command's answer came
            # after the grant's news: it must not be claimed again)
            self.registrations.append(registration)
        grant = self.grant
        if grant is not None and grant.registration.seq < registration.seq:
            self.grant = None

    def forget(self, registration: Registration) -> None:
        """A command carrying `registration` was answered without putting it in Redis."""
        with contextlib.suppress(ValueError):
            self.registrations.remove(registration)

    def give_back(self) -> list[str]:
        """The tokens of every registration, forgotten here with any grant heard for them:
        the command about to be sent gives back what was granted under them."""
        tokens = self.claim_tokens()
        self.registrations.clear()
        self.grant = None
        return tokens

    def claim_tokens(self) -> list[str]:
        """Tokens the lock may be granted under, for an acquire or withdrawal to claim."""
        return [registration.token for registration in self.registrations]

    def pop_grant(self) -> Grant | None:
        """The grant heard of, if it could be taken without asking Redis; forgotten here.

        Only a grant to the newest registration can: a later attempt whose answer was lost
        (cancelled, failed) may have claimed a grant to an older one. For any other grant
        (or one the caller declines) the head must try: its acquire claims the grant if it
        is still there.
        """
        grant, self.grant = self.grant, None
        if grant is None or not self.registrations:
            return None
        return grant if grant.registration is self.registrations[-1] else None

    def took(self, grant: Grant, *, requeued: bool = False) -> None:
        """The head took `grant` (from `pop_grant`) as its lease. The grant took the entry
        out of the queue in Redis, or, if `requeued`, put it at the back (counting one
        waiter less)."""
        self._spent = max(self._spent, grant.registration.seq)
        self.registrations.clear()
        self.requeued = requeued
        self.counted = max(self.counted - 1, 1) if requeued and self.counted else None

    # ----------------------------------------------------------------- the subscription
    def subscription_requested(self) -> None:
        """SUBSCRIBE was sent for the queue's channel on the current connection."""
        self.requested = True

    def subscription_kept(self) -> None:
        """The channel is still subscribed, from earlier waiters."""
        self.requested = True
        self.subscribed.set()

    def subscription_confirmed(self) -> None:
        """The server confirmed the subscription. A duplicate confirmation wakes the head
        (to check the lock, to be safe), and so does one after a lost connection: a
        release may have come while the channel was unheard, after the head's last try."""
        if self.subscribed.is_set():
            self.wake_head()
            return
        self.subscribed.set()
        if self.reconnected:
            self.reconnected = False
            self.wake_head()

    def subscription_lost(self) -> None:
        """The connection was closed: the subscription must be made again."""
        self.reconnected = self.reconnected or self.subscribed.is_set()
        self.subscribed.clear()
        self.requested = False

    def subscription_refused(self, error: Exception) -> None:
        """The server refused the subscription: every waiter raises it (`Waiter.check`)."""
        self.refusal = error
        self.subscribed.set()
        for waiter in self.waiters:
            waiter.nudge()

    # ----------------------------------------------------------------- the head's attempt
    def attempt_started(self, grant_ms: int, sent_at: float) -> tuple[list[str], Registration]:
        """The head sends an attempt: the tokens it claims (grants to earlier registrations)
        and the fresh registration it carries. The caller must call `attempt_ended()` once
        it is answered or failed, and `attempt_answered()` or `attempt_refused()`."""
        claims = self.claim_tokens()
        registration = self.register(grant_ms, sent_at)
        self.attempting = True
        return claims, registration

    def attempt_ended(self) -> None:
        """The head's attempt was answered or failed: a head that waited for it goes on."""
        self.attempting = False
        self.nudge_head()

    def attempt_refused(self, registration: Registration) -> None:
        """The attempt carrying `registration` failed with a known outcome: not in Redis."""
        self.forget(registration)

    def attempt_answered(self, registration: Registration, *, queued: bool, behind: int) -> None:
        """The attempt carrying `registration` was applied: it left the head queued (`queued`:
        refused) or acquired, with `behind` waiters of this process behind it.

        The entry now counts this waiter and those behind it (those behind it alone once it
        acquired; none left: no entry).
        """
        self.settle(registration, in_redis=queued or behind > 0)
        self.counted = behind + 1 if queued else behind or None

    # ----------------------------------------------------------------- a local release
    def joining_started(
        self, grant_ms: int, sent_at: float, *, give_back: bool
    ) -> tuple[list[str], Registration]:
        """A release of this process puts the queue in line: the tokens it gives back (if
        `give_back`: leases granted to earlier registrations, forgotten now so that the head
        cannot take one while the call is under way) and the fresh registration it carries.
        The caller must call `joining_answered()` or `joining_failed()`."""
        claims = self.give_back() if give_back else []
        registration = self.register(grant_ms, sent_at)
        self.joining = True
        return claims, registration

    def joining_failed(self) -> None:
        """The release failed: whether it put the queue in line is unknown, the head tries."""
        self.joining = False
        self.wake_head()

    def joining_answered(self, registration: Registration, status: int, count: int) -> None:
        """The release carrying `registration` answered `status` (see RELEASE), having
        written `count` waiters into the entry if it released."""
        self.joining = False
        if status == 1:
            self.settle(registration, in_redis=True)
            self.counted = count
        elif status == 0:
            self.forget(registration)  # nothing was released, nor put in line
        # 2: an earlier attempt of this call released (and may have granted to this
        # registration): the head, nudged here, claims such a grant with an acquire.
        self.nudge_head()

    @property
    def miscounted(self) -> bool:
        """Whether the queue's entry in Redis counts another number of waiters than wait
        here (some joined or left since it was written): the head writes it again."""
        return (
            self.counted is not None
            and self.registered
            and self.counted != len(self.waiters)
            and not (self.attempting or self.joining)
        )

    def announced(self, fence: str, node: int, *, needed: int, recheck_ms: int) -> None:
        """Node `node` of a quorum (a Redlock's) announced the release of the lease whose
        fencing token is `fence`: the release is effective on that node.

        Every node the release lands on announces it, with the same fencing token, each
        when it gets there, whatever their order and timing. The head is woken once, by
        the announcement that makes `needed` nodes (a majority) heard: a try before it
        would be refused by the nodes still held, or split the vote. One heard while the
        head's try is in flight leaves a wake-up for after its answer. Fewer announcements
        than that (a node's release failed, or its message was lost; a node that refused
        no one announces nothing) leave the head told to check within `recheck_ms`, the
        time the release's other nodes had to answer, and it sleeps on. Not counted: a
        node heard twice; the echoes of a release of this process (its reply, once a
        majority released, woke the head: `released`); a release older than a lease this
        process took since (`lease_taken`), which holds the lock, or did."""
        if not self.waiters or fence in self._recent or (fence, node) in self._heard:
            return
        if fence.isdigit() and int(fence) <= self._newest:
            return
        self._heard.append((fence, node))
        heard = sum(1 for told, _ in self._heard if told == fence)
        if heard == needed:
            self.wake_head()
        elif heard < needed:
            self.check_within(recheck_ms)

    def lease_taken(self, fencing_token: int) -> None:
        """A lease with `fencing_token` was taken in this process (a quorum's, whose tokens
        increase from one holder to the next): a release announced with a token no higher
        is of a lease that ended before it began."""
        self._newest = max(self._newest, fencing_token)

    def released(
        self,
        fence: str,
        reserved_for: str,
        *,
        granted: str = "",
        seq: str = "",
        sent_at: float = 0.0,
        expiry_ms: int = 0,
        slot: str = "",
        after: int = -1,
    ) -> None:
        """A release was seen, from this process's own release or from the channel.

        `expiry_ms` is the grant's expiry as the release reported it (0: not reported, as
        on the channel, where it is at most RESERVATION_MS); `after` what a semaphore's
        grant to this queue left: -1 the queue put back in line (or not reported), else
        the permits still free.

        If the lock was granted to this queue, the grant is kept for the head to take. If
        it was reserved for this queue or handed to nobody, the head is woken to try. If it
        went to another process's queue, the head is told to check again once that grant
        would have lapsed (in case that process died), and sleeps on; a head whose own
        timer ends its sleep by then is left asleep.

        Each release is seen twice when its holder is in this process (the release's
        reply, then its echo on the channel, in either order): the first counts, the
        second is recognised by the fencing token and ignored. A grant to this queue may
        also be told twice, under different fencing tokens (a semaphore's release that
        did not put this queue in line, yet granted to it): the grant's own token tells.
        """
        if fence in self._recent or not self.waiters:
            return
        self._recent.append(fence)
        if granted and reserved_for == self.wid:
            if granted in self._granted:
                return
            self._granted.append(granted)
            for registration in self.registrations:
                if str(registration.seq) == seq:
                    expiry = expiry_ms or min(registration.grant_ms, RESERVATION_MS)
                    self.grant = Grant(
                        registration,
                        int(granted),
                        max(sent_at, registration.sent_at),
                        expiry,
                        int(slot) if slot.isdigit() else None,
                        requeued=after < 0,
                        more=after != 0,
                    )
            self.wake_head()
        elif reserved_for in ("", self.wid):
            self.wake_head()
        else:
            self.check_within(RESERVATION_MS)

    def check_within(self, ms: int) -> None:
        """Tell the head to check the lock within `ms` (the lock was handed to another
        process, which may have died; a release heard from a minority of a quorum's
        nodes); a head whose own timer ends its sleep by then is left asleep, rather than
        woken in every waiting process at every release to change nothing."""
        head = self.waiters[0]
        if head.checks_within(ms / 1000 + POLL_SPREAD):
            return
        head.poll_hint_ms = ms
        head.nudge()
