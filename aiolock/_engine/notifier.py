"""Waiting for a lock without polling: one pub/sub subscription per client.

Every release publishes on the lock's channel. Per backend, one `Notifier` holds one pub/sub
connection (aiolock's own, never one from the user's pool) and a `WaitQueue` (`_engine.wait_queue`) per
lock name that has waiters in this process, and tells each queue what it hears: a release, a
grant, a lost connection, a refused subscription.

Expiry sends no notification, so the head also sleeps no longer than the holder's remaining
ttl (plus a small random spread) before trying again. If the pub/sub connection breaks, every
head is woken to try at once (a release may have been missed), and the subscription is
re-established with backoff.

Silence is not proof that a connection lives: a NAT or a load balancer can drop an idle
one without a reset. After `health_interval` seconds without a word from Redis (2 s unless
the client sets redis-py's `health_check_interval`), the listener sends a PING; if nothing
has come back `health_interval` seconds later, the connection is taken for dead: it is
replaced, every subscription made again, and every head woken to try (which puts its
process back in the lock's queue in Redis). A dead subscription is so found within twice
`health_interval` (4 s by default).

A client of Sentinel (`Sentinel.master_for`) gets a Sentinel-managed pub/sub connection,
which finds the master when it connects. After a failover the former master may keep its
role, and this connection, for seconds before the Sentinels demote it, while releases are
published on the new master: so every `health_interval` the listener asks the Sentinels
where the master is, and if it moved, replaces the connection (as a silent one).

A release from this same process wakes the local head directly, before the notification
comes back from Redis; the notification that follows is recognised by its fencing token
and ignored, so one release wakes one waiter.

Watched channels (`Watch`, an election's observers) ride on the same connection: each
message tells the watch, and so does every loss of the connection and every subscription
made again on the next one, after which the reader reads the state it watches anew.

On a cluster the "connection" is a session per node (`_transport.cluster_pubsub`, sharded pub/sub),
read as one: it tells of a channel it lost on its own (its slot moved, its node went
silent) with a message of kind "lost", treated as a lost connection for that channel's
waiters and watches; it subscribes the channel again by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import secrets
from typing import TYPE_CHECKING, Any, Final

from .._aio.backoff import Backoff
from .._transport.pubsub import Inbox, PubSubSession
from .._transport.quorum import QuorumBackend
from ..errors import BackendError
from .wait_queue import Waiter, WaitQueue

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub

    from .._transport.backend import Backend

__all__ = ("Notifier", "Watch")

logger = logging.getLogger("aiolock")

SUBSCRIBE_TIMEOUT: Final = 2.0
"""Longest a new waiter waits for its subscription to be confirmed before it relies on its
fallback timer alone (the server may be unreachable: its attempts will say so)."""

LINGER: Final = 1.0
"""Seconds a subscription (and the pub/sub connection) outlives its last waiter, so that
waiting in bursts does not subscribe and unsubscribe every time."""

HEALTH_INTERVAL: Final = 2.0
"""Seconds of silence on the pub/sub connection before it is asked for a PING, and then
for its answer, unless the client sets redis-py's `health_check_interval`."""


class _Silent(Exception):
    """The pub/sub connection did not answer a PING in time: taken for dead."""


class _Moved(Exception):
    """The pub/sub connection is open to a server the Sentinels no longer name as master."""


def _connected(pubsub: PubSub) -> bool:
    """Whether the pub/sub session has its connection (it opens on the first command)."""
    return getattr(pubsub, "connection", None) is not None


class _Health:
    """What the listener knows of its connection's health."""

    __slots__ = ("checked", "every", "heard", "ping_refused", "pinged")

    def __init__(self, now: float, interval: float | None) -> None:
        self.every = interval or HEALTH_INTERVAL
        self.heard = now  # when Redis last said anything on this connection
        self.pinged: float | None = None  # when the PING now unanswered was sent
        self.ping_refused = False
        self.checked = now  # when the Sentinels were last asked where the master is


class Watch:
    """A channel watched for its messages (an election's changes), not a wait queue.

    Told of every message, and of every new subscription after a lost one (messages may
    have been missed meanwhile): its reader then reads the state again. Made by
    `Notifier.watch`, ended by `Notifier.unwatch`.
    """

    __slots__ = ("_told", "channel", "refusal", "subscribed")

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._told = asyncio.Event()
        self.subscribed = asyncio.Event()  # set once subscribed, or once refused
        self.refusal: Exception | None = None

    def tell(self) -> None:
        self._told.set()

    async def wait(self, timeout: float | None) -> bool:
        """Sleep until told (True: cleared now) or until `timeout` passes (False).

        Raises:
            BackendError: the server refused the subscription.
        """
        if not self._told.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._told.wait()
        self.check()
        told = self._told.is_set()
        self._told.clear()
        return told

    def check(self) -> None:
        """Raise `BackendError` if the server refused the subscription."""
        if self.refusal is not None:
            raise BackendError(
                f"subscription to {self.channel!r} was refused: {self.refusal}",
                operation="subscribe",
                name=None,
            ) from self.refusal


class Notifier:
    """The pub/sub subscription and wait queues of one backend."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        # On a quorum's backend (a Redlock's), how many nodes' announcements of a release
        # free the lock, and how long its calls to the others may take (see `announced`).
        self._needed, self._recheck_ms = 1, 0
        if isinstance(backend, QuorumBackend):
            self._needed, self._recheck_ms = backend.size, round(backend.node_timeout * 1000)
        # A channel's name comes back as bytes in the client's encoding (as it was sent).
        self._encoding = backend.encoding
        self._queues: dict[str, WaitQueue] = {}
        # This process's channel id (see DIRECT_PREFIX), and the queues by their channel of
        # it: `<name's channel>:<direct id>`.
        self._direct_id = "p" + secrets.token_hex(4)
        self._direct: dict[str, WaitQueue] = {}
        self._tickets = itertools.count()
        # The tickets of first tries in flight (several tasks may try at once while none
        # waits), by channel, and what waits for one of them to be answered.
        self._trying: dict[str, set[int]] = {}
        self._tried: dict[str, list[asyncio.Future[None]]] = {}
        self._subscribed: dict[str, float] = {}  # channel -> time it last had no waiters
        self._watches: dict[str, list[Watch]] = {}  # see watch()
        self._watch_requested: set[str] = set()  # watched channels SUBSCRIBEd on this connection
        self._pubsub: PubSub | None = None
        self._health: _Health | None = None  # the listener's, while it runs
        self._task: asyncio.Task[None] | None = None
        self.rng = random.Random()
        self.messages_received = 0
        self.silent_connections = 0  # pub/sub connections replaced for not answering a PING

    def queue_length(self, channel: str) -> int:
        queue = self._queues.get(channel)
        return len(queue.waiters) if queue is not None else 0

    def is_subscribed(self, channel: str) -> bool:
        """Whether waiters of `channel` are subscribed (a release now reaches them)."""
        queue = self._queues.get(channel)
        return queue is not None and queue.subscribed.is_set() and queue.refusal is None

    @property
    def running(self) -> bool:
        return self._task is not None

    async def wait_idle(self) -> None:
        """Wait until the listener task has ended (no waiter for LINGER seconds)."""
        while self._task is not None:
            await asyncio.wait({self._task})

    def ticket(self) -> int:
        """The order of an acquire() call among this process's calls: its waiters are
        served in it."""
        return next(self._tickets)

    def start_try(self, channel: str, ticket: int) -> None:
        """The acquire() call `ticket` sends its first try (nobody of the process waits)."""
        self._trying.setdefault(channel, set()).add(ticket)

    def end_try(self, channel: str, ticket: int) -> None:
        """The first try of call `ticket` was answered (or failed): a head and tasks that
        waited for it go on."""
        trying = self._trying.get(channel)
        if trying is None:
            return
        trying.discard(ticket)
        if not trying:
            del self._trying[channel]
        for future in self._tried.pop(channel, ()):
            if not future.done():
                future.set_result(None)
        queue = self._queues.get(channel)
        if queue is not None and queue.waiters:
            queue.waiters[0].nudge()

    def trying_before(self, channel: str, ticket: int) -> bool:
        """Whether an acquire() called before call `ticket` has its first try in flight."""
        trying = self._trying.get(channel)
        return trying is not None and any(other < ticket for other in trying)

    async def tries_before(self, channel: str, ticket: int) -> None:
        """Wait until no acquire() called before call `ticket` has its first try in flight
        (each is bounded by its own timeout)."""
        while self.trying_before(channel, ticket):
            future = self._backend.loop.create_future()
            self._tried.setdefault(channel, []).append(future)
            await future

    def first_before(self, channel: str, ticket: int) -> Waiter | None:
        """The waiter of the earliest acquire() call before call `ticket` that waits for
        `channel` without a lease handed to it, if any."""
        queue = self._queues.get(channel)
        if queue is None:
            return None
        for waiter in queue.waiters:
            if waiter.ticket >= ticket:
                return None
            if waiter.handed is None and waiter.accepts:
                return waiter
        return None

    def next_without(self, channel: str, but: Waiter | None) -> Waiter | None:
        """The first waiter for `channel` (other than `but`) that takes a lease and has
        none handed to it, if any."""
        queue = self._queues.get(channel)
        if queue is None:
            return None
        for waiter in queue.waiters:
            if waiter is not but and waiter.handed is None and waiter.accepts:
                return waiter
        return None

    def join(
        self,
        channel: str,
        ticket: int | None = None,
        *,
        accepts: bool = True,
        direct: bool = False,
    ) -> Waiter:
        """Queue up for `channel`: a new waiter, behind every waiter of an earlier acquire()
        call (`ticket`; default: a new one, at the back). With `direct` (the primitive's
        scripts can tell a grant to one process), a new queue also listens on this
        process's channel of the name.

        The caller must `leave()` it whatever happens next (cancellation included), and
        withdraw the queue `leave()` returns; then `ready()` subscribes it.
        """
        queue = self._queues.get(channel)
        if queue is None:
            queue = self._queues[channel] = WaitQueue(channel, self._direct_id if direct else None)
            for own in queue.channels[1:]:
                self._direct[own] = queue
            kept = [self._subscribed.pop(each, None) is not None for each in queue.channels]
            if all(kept):
                queue.subscription_kept()  # still subscribed from earlier waiters
        waiter = Waiter(queue, self.ticket() if ticket is None else ticket, accepts=accepts)
        waiters = queue.waiters
        position = len(waiters)
        while position > 0 and waiters[position - 1].ticket > waiter.ticket:
            position -= 1
        waiters.insert(position, waiter)
        if len(waiters) > 1:
            waiters[0].nudge()  # its entry in Redis counts one waiter less (no command)
            if position == 0:
                waiters[1].nudge()  # no longer the head
        return waiter

    async def ready(self, waiter: Waiter, *, timeout: float | None) -> None:
        """Wait until `waiter`'s queue is subscribed (at most `timeout`, or SUBSCRIBE_TIMEOUT).

        Once this returns subscribed, no release can go unnoticed: a release before the
        subscription took effect is seen by the caller's next attempt, one after it by the
        notification. If it returns without (the server may be unreachable), the head's
        attempts and fallback timer still work.

        Raises:
            BackendError: the server refused the subscription.

        Cancellation:
            Safe; the waiter stays queued for the caller to `leave()`.
        """
        queue = waiter.queue
        if not queue.subscribed.is_set():
            await self._subscribe(queue)
            bound = SUBSCRIBE_TIMEOUT if timeout is None else min(timeout, SUBSCRIBE_TIMEOUT)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(bound):
                    await queue.subscribed.wait()
        waiter.check()

    def leave(self, waiter: Waiter, *, acquired: bool, more: bool = False) -> WaitQueue | None:
        """Take `waiter` out of its queue.

        If it was at the head and did not acquire, the next waiter is woken to try at once
        (and takes a grant the leaver did not): a release meant for the leaver must not be
        lost. If it acquired, the next waiter becomes head without trying (the lock is
        held), and waits for the release; unless `more` (a semaphore's permits may still
        be free, or the queue must be put back in line): then it is woken to try.

        Returns the queue the caller must withdraw from Redis (the last waiter of this
        process left, and the lock may still be reserved or granted to its queue), or None.
        """
        queue = waiter.queue
        was_head = waiter.is_head
        try:
            queue.waiters.remove(waiter)
        except ValueError:
            return None
        if queue.waiters:
            if was_head:
                if acquired and not more:
                    # The lock is held here: its release queues the others in Redis (or
                    # grants to them) and wakes the next head.
                    queue.waiters[0].nudge()
                else:
                    queue.waiters[0].wake()
            else:
                queue.waiters[0].nudge()  # its entry in Redis counts one waiter more
            return None
        del self._queues[queue.channel]
        for own in queue.channels[1:]:
            del self._direct[own]
        if queue.requested:
            for each in queue.channels:
                self._subscribed[each] = self._backend.loop.time()
        return queue if queue.registered else None

    def queue_for(self, channel: str) -> WaitQueue | None:
        """This process's queue of waiters for `channel`, if any wait."""
        return self._queues.get(channel)

    def local_release(
        self,
        channel: str,
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
        """A lease of this process was released: act on it without waiting for the echo.

        `sent_at` is when the release was sent: before any grant it made; `expiry_ms` the
        expiry of that grant.
        """
        queue = self._queues.get(channel)
        if queue is not None:
            queue.released(
                fence,
                reserved_for,
                granted=granted,
                seq=seq,
                sent_at=sent_at,
                expiry_ms=expiry_ms,
                slot=slot,
                after=after,
            )

    # ----------------------------------------------------------------- the listener
    async def _subscribe(self, queue: WaitQueue) -> None:
        self._ensure_listener()
        if queue.requested:
            return
        if self._pubsub is not None and _connected(self._pubsub):
            queue.subscription_requested()
            try:
                await self._pubsub.subscribe(*queue.channels)
            except Exception as exc:
                if not self._backend.broken(exc):
                    raise
                # The listener sees the broken connection too and re-subscribes everything.
                logger.debug("aiolock: subscribe failed, the listener will retry: %s", exc)

    def _ensure_listener(self) -> None:
        if self._task is None:
            self._pubsub = self._new_pubsub()
            self._task = self._backend.loop.create_task(self._listen(), name="aiolock-notifier")

    def _new_pubsub(self) -> PubSub:
        """The backend's pub/sub, which hands its messages to `_delivered` as they are read:
        aiolock's own session (`PubSubSession`), or one made of node sessions (an `Inbox`)."""
        pubsub = self._backend.new_pubsub()
        if isinstance(pubsub, PubSubSession):
            pubsub.deliver = self._delivered
        inbox = getattr(pubsub, "inbox", None)
        if isinstance(inbox, Inbox):
            inbox.deliver = self._delivered
        return pubsub

    def _delivered(self, message: dict[str, Any]) -> None:
        """A message handed over as it arrived (in the event loop's callback that received
        it, or a node session's task): heard, and dispatched as if the listener had read it."""
        health = self._health
        if health is not None:
            health.heard, health.pinged = self._backend.loop.time(), None
        self._dispatch(message)

    async def _listen(self) -> None:
        backoff = Backoff(base=0.05, cap=2.0, rng=self.rng)
        cancelled = False
        health = self._health = _Health(self._backend.loop.time(), self._backend.health_interval)
        try:
            while self._queues or self._subscribed or self._watches:
                try:
                    message = await self._next_message(health)
                except _Moved as exc:
                    logger.warning("aiolock: pub/sub connection to a former master: %s", exc)
                    await self._replace_lost()
                    continue
                except _Silent as exc:
                    self.silent_connections += 1
                    logger.warning(
                        "aiolock: pub/sub connection silent for %.1fs, replacing it: %s",
                        self._backend.loop.time() - health.heard,
                        exc,
                    )
                    await self._replace_lost()
                    continue
                except Exception as exc:
                    if not self._backend.broken(exc):
                        raise
                    if health.pinged is not None and self._ping_refused(exc, health):
                        continue
                    await self._connection_failed(exc)
                    await asyncio.sleep(backoff.next())
                    continue
                backoff.reset()
                if message is not None:
                    self._dispatch(message)
                if self._subscribed:  # (channels without waiters, kept for LINGER seconds)
                    await self._drop_idle_channels(self._backend.loop.time())
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            self._health = None
            try:
                await self._reset_pubsub(replace=False)
            finally:
                self._task = None
                if (self._queues or self._watches) and not cancelled:
                    # Waiters arrived while the connection was closing: start over.
                    self._ensure_listener()
                    for queue in self._queues.values():
                        queue.wake_head()

    async def _next_message(self, health: _Health) -> dict[str, Any] | None:
        """Subscribe on a new connection, keep it checked (a PING after silence, the
        Sentinels' master), and read the next message (None: none came in time).

        Raises `_Silent` or `_Moved` for a connection to replace, and the connection's own
        errors."""
        pubsub = self._pubsub
        assert pubsub is not None
        loop = self._backend.loop
        every = health.every
        if not _connected(pubsub):
            for queue in self._queues.values():
                queue.subscription_requested()
            self._watch_requested = set(self._watches)
            listened = [each for queue in self._queues.values() for each in queue.channels]
            await pubsub.subscribe(*listened, *self._subscribed, *self._watches)
            await self._subscribe_latecomers(pubsub)
            health.heard, health.pinged = loop.time(), None
        now = loop.time()
        if health.pinged is not None and now - health.pinged >= every:
            raise _Silent(f"no answer to a PING within {every:g}s")
        if health.pinged is None and now - health.heard >= every:
            await pubsub.ping()
            health.pinged = now
        if self._backend.sentinel and now - health.checked >= every:
            health.checked = now
            if await self._backend.master_moved(pubsub):
                raise _Moved("the Sentinels name another master")
        wait = (health.pinged if health.pinged is not None else health.heard) + every - now
        if self._backend.sentinel:
            wait = min(wait, health.checked + every - now)
        message: dict[str, Any] | None = await pubsub.get_message(
            timeout=max(min(LINGER, wait), 0.001)
        )
        if message is not None:
            health.heard, health.pinged = loop.time(), None
        return message

    async def _subscribe_latecomers(self, pubsub: PubSub) -> None:
        """Subscribe the queues and watches that came while the connection was opening:
        they found no connection to subscribe on, and left it to the listener."""
        while True:
            queues = [queue for queue in self._queues.values() if not queue.requested]
            watched = [channel for channel in self._watches if channel not in self._watch_requested]
            if not queues and not watched:
                return
            for queue in queues:
                queue.subscription_requested()
            self._watch_requested.update(watched)
            await pubsub.subscribe(*(each for queue in queues for each in queue.channels), *watched)

    def _ping_refused(self, exc: Exception, health: _Health) -> bool:
        """Whether `exc` is the PING refused by an ACL without +ping: an answer all the
        same (warned about once)."""
        if not (self._backend.refused(exc) and "ping" in str(exc)):
            return False
        if not health.ping_refused:
            health.ping_refused = True
            logger.warning(
                "aiolock: PING refused on the pub/sub connection (add +ping to the user's ACL): %s",
                exc,
            )
        health.heard, health.pinged = self._backend.loop.time(), None
        return True

    async def _replace_lost(self) -> None:
        """Replace a connection taken for lost; every head tries (a release may have been
        missed)."""
        await self._reset_pubsub(replace=True)
        for queue in self._queues.values():
            queue.wake_head()

    async def _connection_failed(self, exc: Exception) -> None:
        """The connection broke, or the server refused the subscription: replace it, and
        tell every waiter and watch."""
        await self._reset_pubsub(replace=True)
        if self._backend.refused(exc):
            logger.warning("aiolock: subscription refused: %s", exc)
            for queue in self._queues.values():
                queue.subscription_refused(exc)
            self._refuse_watches(exc)
        else:
            logger.warning("aiolock: pub/sub connection lost, reconnecting: %s", exc)
            for queue in self._queues.values():
                queue.wake_head()  # a release may have been missed

    async def _reset_pubsub(self, *, replace: bool) -> None:
        """Close the pub/sub connection; every subscription must be made again."""
        pubsub = self._pubsub
        self._pubsub = self._new_pubsub() if replace else None
        self._subscribed = {}
        for queue in self._queues.values():
            queue.subscription_lost()
        self._unsubscribe_watches()
        if pubsub is not None:
            await pubsub.aclose()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        channel = message["channel"]
        if isinstance(channel, bytes):
            channel = channel.decode(*self._encoding)
        if channel in self._watches:
            self._watched(kind, channel)
            return
        queue = self._queues.get(channel) or self._direct.get(channel)
        if kind == "subscribe":
            if queue is None:
                self._subscribed.setdefault(channel, self._backend.loop.time())
            elif channel == queue.channels[-1]:
                # (its channels are subscribed in order: the last confirms them all)
                queue.subscription_confirmed()
        elif kind == "lost" and queue is not None:
            # A cluster's sharded session lost the channel (its slot moved, its node went
            # silent) and subscribes it again: the head tries now and once it is heard.
            queue.subscription_lost()
            queue.subscription_requested()
            queue.wake_head()
        elif kind == "message" and queue is not None:
            self.messages_received += 1
            data = message["data"]
            text = data.decode() if isinstance(data, bytes) else str(data)
            fence, reserved_for, granted, seq, slot, *_ = (*text.split(" ", 5), "", "", "", "")
            node = message.get("node")  # a quorum's node (`QuorumPubSub`): each announces it
            if node is not None:
                queue.announced(fence, node, needed=self._needed, recheck_ms=self._recheck_ms)
            else:
                queue.released(fence, reserved_for, granted=granted, seq=seq, slot=slot)

    async def _drop_idle_channels(self, now: float) -> None:
        idle = [ch for ch, since in self._subscribed.items() if now - since >= LINGER]
        if idle and self._pubsub is not None:
            for channel in idle:
                del self._subscribed[channel]
            try:
                await self._pubsub.unsubscribe(*idle)
            except Exception as exc:
                if not self._backend.broken(exc):
                    raise
                await self._reset_pubsub(replace=True)

    # ----------------------------------------------------------------- watched channels
    def watch(self, channel: str) -> Watch:
        """Watch `channel` on this client's pub/sub connection, kept alive (and replaced
        when silent) as for waiters; `watch_ready()` subscribes. The caller must
        `unwatch()` it whatever happens next."""
        watch = Watch(channel)
        watchers = self._watches.setdefault(channel, [])
        if self._subscribed.pop(channel, None) is not None or any(
            other.subscribed.is_set() for other in watchers
        ):
            self._watch_requested.add(channel)  # still subscribed, from earlier watchers
            watch.subscribed.set()
        watchers.append(watch)
        self._ensure_listener()
        return watch

    async def watch_ready(self, watch: Watch, *, timeout: float = SUBSCRIBE_TIMEOUT) -> None:
        """Wait until `watch`'s channel is subscribed (at most `timeout`): from then on no
        message is missed unnoticed (a lost connection tells the watch). Whatever it was
        told before is forgotten: the caller reads the state after this.

        Raises:
            BackendError: the server refused the subscription.

        Cancellation:
            Safe; the watch stays for the caller to `unwatch()`.
        """
        channel = watch.channel
        if not watch.subscribed.is_set():
            pubsub = self._pubsub
            if channel not in self._watch_requested and pubsub is not None and _connected(pubsub):
                self._watch_requested.add(channel)
                try:
                    await pubsub.subscribe(channel)
                except Exception as exc:
                    if not self._backend.broken(exc):
                        raise
                    # The listener sees the broken connection too and subscribes again.
                    logger.debug("aiolock: subscribe failed, the listener will retry: %s", exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await watch.subscribed.wait()
        watch.check()
        watch._told.clear()

    def unwatch(self, watch: Watch) -> None:
        """Stop watching; the channel is unsubscribed after LINGER seconds unwatched."""
        watchers = self._watches.get(watch.channel)
        if watchers is None or watch not in watchers:
            return
        watchers.remove(watch)
        if not watchers:
            del self._watches[watch.channel]
            if watch.channel in self._watch_requested:
                self._watch_requested.discard(watch.channel)
                self._subscribed[watch.channel] = self._backend.loop.time()

    def _watched(self, kind: str, channel: str) -> None:
        for watch in self._watches[channel]:
            if kind == "subscribe":
                watch.subscribed.set()
            elif kind == "lost":
                watch.subscribed.clear()
            watch.tell()

    def _unsubscribe_watches(self) -> None:
        """The connection was closed: every watch may miss a message until subscribed again."""
        self._watch_requested.clear()
        for watchers in self._watches.values():
            for watch in watchers:
                watch.subscribed.clear()
                watch.tell()

    def _refuse_watches(self, error: Exception) -> None:
        for watchers in self._watches.values():
            for watch in watchers:
                watch.refusal = error
                watch.subscribed.set()
                watch.tell()
