"""Renewal of every lease of one client by one timer-driven task.

One `RenewalScheduler` per backend keeps a heap of leases ordered by when they are next due.
When the earliest is due it renews, in one script call, every lease due within a quarter of
its interval (so leases drift together into shared batches), up to `MAX_BATCH` per call.
The task exists only while some lease needs renewing (and for IDLE_LINGER seconds after),
and closes its connections when it ends.

Calls do not wait for each other: each batch (and each release of an abandoned lease) runs
in a task of its own, on a connection of its own, bounded by its own leases' deadlines. A
call stuck on a dead connection therefore never delays another lease's renewal; at most
MAX_IN_FLIGHT calls are outstanding at once.

What the scheduler decides, and what it leaves to the lease:
- a renewal answered 1 moves the lease's deadline to (time the batch was *sent*) + ttl -
  margin; answered 0 means "not owner": the lease is lost at once;
- a batch that fails (no reply in time, connection error) is retried with backoff, and the
  error is remembered as the cause if the lease's deadline passes first. The deadline itself
  is a timer owned by the lease, so a slow or failed batch never delays a loss;
- near its `max_hold`, a lease is renewed only up to it (the key then expires when it is
  reached), and no more after: it ends at its deadline.

Leases are held weakly. A lease garbage-collected while held (its holder forgot to release
it) warns like an unclosed file, and the scheduler releases its key in the next batch.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from .._aio.backoff import Backoff
from .._lua.lease import RENEW
from .._model import renewal_policy as renewal
from .._model.config import replica_wait_ms
from .._model.quorum_rules import RENEW_VOTES
from .._transport.call_options import CallOptions
from ..errors import BackendError, ReplicationError

if TYPE_CHECKING:
    from .._transport.backend import Backend

__all__ = (
    "IDLE_LINGER",
    "MAX_BATCH",
    "MAX_IN_FLIGHT",
    "Renewable",
    "RenewalEntry",
    "RenewalScheduler",
)

logger = logging.getLogger("aiolock")

IDLE_LINGER: Final = 1.0
"""Seconds the scheduler task outlives its last lease, so that locking in a loop does not
start a task per lease."""

MAX_BATCH: Final = 1000
"""Most leases renewed by one script call: keeps each call well under a millisecond of
server time."""

MAX_IN_FLIGHT: Final = 16
"""Most renewal (and abandoned-lease release) calls outstanding at once, each on its own
connection."""


class Renewable(Protocol):
    """What the scheduler tells a lease (`_engine.lease.Lease`) about its renewals."""

    @property
    def deadline(self) -> float: ...

    def _renewal_sent(self, sent_at: float, ttl: float) -> None: ...

    def _renewal_answered(self, sent_at: float, ttl: float) -> None: ...

    def _renewed(self, sent_at: float, ttl: float | None = None) -> None: ...

    def _renew_failed(self, error: BaseException) -> None: ...

    def _renewal_stopped(self) -> None: ...

    def _not_owner(self) -> None: ...


class RenewalEntry:
    """The scheduler's record of one lease: what to send, and when."""

    __slots__ = (
        "active",
        "backoff",
        "due",
        "interval",
        "key",
        "kind",
        "lease_ref",
        "release",
        "replica_timeout",
        "replicas",
        "stop_at",
        "token",
        "ttl_ms",
    )

    def __init__(
        self,
        *,
        lease_ref: Callable[[], Renewable | None],
        key: str,
        token: str,
        ttl_ms: int,
        interval: float,
        due: float,
        stop_at: float | None,
        rng: random.Random,
        release: Callable[[], Awaitable[object]],
        kind: str = "",
        replicas: int = 0,
        replica_timeout: float = 0.0,
    ) -> None:
        self.lease_ref = lease_ref
        self.key = key
        self.kind = kind  # how the key holds the lease: see RENEW
        self.token = token
        self.release = release  # deletes the key if still ours: for an abandoned lease
        self.ttl_ms = ttl_ms
        self.interval = interval
        self.due = due
        self.stop_at = stop_at
        self.active = True
        self.backoff: Backoff | None = None  # made at the first failure
        self.replicas = replicas  # replicas that must acknowledge a renewal (WAIT)
        self.replica_timeout = replica_timeout

    def ttl_ms_at(self, now: float) -> int:
        """The expiry to set now: the ttl, or less once `stop_at` is nearer (0: stop)."""
        return renewal.capped_ttl_ms(self.ttl_ms, self.stop_at, now)


_Live = tuple[RenewalEntry, Renewable, int, bool]
"""An entry of a batch, its lease, the expiry (ms) the batch sets, and whether that
expiry is capped at the lease's `max_hold` (its last renewal). Decided when the batch is
sent: the lease may have a new ttl (`extend(ttl=...)`) by the time it is answered."""


def _one_call_per_key(
    keys: Sequence[str], args: Sequence[str | int]
) -> list[tuple[Sequence[str], Sequence[str | int]]]:
    """A RENEW call of several keys as one call per key (each renewal stands alone): while
    their slot migrates, a call naming several keys is refused, one naming one key is
    redirected to wherever the key is."""
    return [(keys[i : i + 1], args[3 * i : 3 * i + 3]) for i in range(len(keys))]


class RenewalScheduler:
    """Renews the leases of one backend; see the module docstring."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._heap: list[tuple[float, int, RenewalEntry]] = []
        self._seq = itertools.count()
        self._active = 0
        self._abandoned: list[RenewalEntry] = []
        self._task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self._wakeup: asyncio.Future[bool] | None = None
        self._sleeping_until: float | None = None
        self.rng = random.Random()
        self.batches_sent = 0

    @property
    def active(self) -> int:
        """Number of leases being renewed."""
        return self._active

    @property
    def running(self) -> bool:
        return self._task is not None

    def add(self, entry: RenewalEntry) -> None:
        self._active += 1
        heapq.heappush(self._heap, (entry.due, next(self._seq), entry))
        if self._task is None:
            self._ensure_running()
        elif self._sleeping_until is None or entry.due < self._sleeping_until:
            self._wake()

    def remove(self, entry: RenewalEntry) -> None:
        """Stop renewing; takes effect before the scheduler sends anything else.

        The scheduler is not woken: it skips inactive entries when they come due, and
        drops them in bulk once they outnumber the active ones, or at once when none is
        left active (each holds its lock, and so the client: an event loop that ends
        before they come due must not keep them).
        """
        if entry.active:
            entry.active = False
            self._active -= 1
            if not self._active:
                self._heap.clear()
            elif len(self._heap) > 2 * self._active + 64:
                self._drop_inactive()

    def _drop_inactive(self) -> None:
        """Drop the heap's items of removed entries, and those a reschedule left behind."""
        self._heap = [item for item in self._heap if item[2].active and item[0] == item[2].due]
        heapq.heapify(self._heap)

    def postpone(self, entry: RenewalEntry, due: float) -> None:
        """The lease was renewed by other means: next due at `due` instead."""
        if entry.active and due > entry.due:
            self._reschedule(entry, due)

    def hasten(self, entry: RenewalEntry, due: float) -> None:
        """The lease must be renewed by `due` at the latest (its ttl became shorter)."""
        if entry.active and due < entry.due:
            self._reschedule(entry, due)
            if self._sleeping_until is None or due < self._sleeping_until:
                self._wake()

    def abandon(self, entry: RenewalEntry) -> None:
        """The lease was garbage-collected while held: release its key in the background."""
        if entry.active:
            self.remove(entry)
            self._abandoned.append(entry)
            self._ensure_running()
            self._wake()

    async def wait_idle(self) -> None:
        """Wait until the scheduler's task has ended (no lease left to renew)."""
        while self._task is not None:
            await asyncio.wait({self._task})

    def _ensure_running(self) -> None:
        if self._task is None and self._backend.loop.is_running():
            self._task = self._backend.loop.create_task(self._run(), name="aiolock-renewals")

    def _wake(self, time_up: bool = False) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(time_up)

    async def _sleep_until(self, when: float | None) -> bool:
        """Sleep until `when` (None: until woken), or until woken; whether `when` came."""
        loop = self._backend.loop
        self._wakeup = loop.create_future()
        self._sleeping_until = when
        handle = None if when is None else loop.call_at(when, self._wake, True)
        try:
            return await self._wakeup
        finally:
            if handle is not None:
                handle.cancel()
            self._wakeup = None
            self._sleeping_until = None

    def _take_due(self, now: float) -> list[RenewalEntry]:
        batch: list[RenewalEntry] = []
        while self._heap and len(batch) < MAX_BATCH:
            due, _, entry = self._heap[0]
            if not entry.active or due != entry.due:
                heapq.heappop(self._heap)  # removed, or rescheduled under a new heap item
                continue
            if due > now + renewal.batch_window(entry.interval):
                break
            heapq.heappop(self._heap)
            batch.append(entry)
        return batch

    def _reschedule(self, entry: RenewalEntry, due: float) -> None:
        entry.due = due
        heapq.heappush(self._heap, (due, next(self._seq), entry))

    def _spawn(self, call: Coroutine[Any, Any, None]) -> None:
        """Run one call (a batch, a release) in a task of its own; wake the loop when done."""
        task = self._backend.loop.create_task(call, name="aiolock-renewal-call")
        self._calls.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._calls.discard(finished)
            self._wake()

        task.add_done_callback(done)

    async def _run(self) -> None:
        loop = self._backend.loop
        cancelled = False
        try:
            while True:
                while self._abandoned and len(self._calls) < MAX_IN_FLIGHT:
                    self._spawn(self._release_abandoned(self._abandoned.pop()))
                while self._heap and (
                    not self._heap[0][2].active or self._heap[0][0] != self._heap[0][2].due
                ):
                    heapq.heappop(self._heap)
                now = loop.time()
                if not self._heap:
                    if self._calls or self._abandoned:
                        await self._sleep_until(None)  # a call ending wakes the loop
                        continue
                    # Idle: stay a moment for the next lease, then end and close the connection.
                    # A wake with nothing to do (a lease added and released before this task
                    # ran: one taken from a grant, whose first renewal is due early, wakes it)
                    # does not cut the moment short, or hand-offs between processes would
                    # start the task, and open its connection, every other round.
                    lingered = False
                    while not (lingered or self._heap or self._abandoned or self._calls):
                        lingered = await self._sleep_until(now + IDLE_LINGER)
                    if self._heap or self._abandoned or self._calls:
                        continue
                    break
                if len(self._calls) >= MAX_IN_FLIGHT:
                    await self._sleep_until(None)
                    continue
                if self._heap[0][0] > now:
                    await self._sleep_until(self._heap[0][0])
                    continue
                batch = self._take_due(now)
                if batch:
                    self._spawn(self._renew(batch))
        except asyncio.CancelledError:
            cancelled = True  # the event loop is shutting down
            raise
        finally:
            try:
                calls = list(self._calls)
                if cancelled:
                    for call in calls:
                        call.cancel()
                if calls:
                    await asyncio.wait(calls)
                await self._backend.close_background_client()
            finally:
                self._task = None
                self._drop_inactive()  # the event loop may end now
                if not cancelled and (self._active or self._abandoned):
                    self._ensure_running()  # work arrived while the connection was closing

    def _live(self, batch: list[RenewalEntry], now: float) -> list[_Live]:
        """The entries of `batch` to renew now, with their leases and the expiry to set
        (capped or not); the others are abandoned (their lease was garbage-collected) or
        stopped (at their `max_hold`)."""
        live: list[_Live] = []
        for entry in batch:
            lease = entry.lease_ref()
            ttl_ms = entry.ttl_ms_at(now)
            if lease is None:
                self.abandon(entry)
            elif ttl_ms <= 0:
                self.remove(entry)
                lease._renewal_stopped()
            else:
                live.append((entry, lease, ttl_ms, ttl_ms < entry.ttl_ms))
        return live

    async def _renew(self, batch: list[RenewalEntry]) -> None:
        loop = self._backend.loop
        live = self._live(batch, loop.time())
        if not live:
            return
        # Bound the call by the deadlines of its own leases, so that a dead connection is
        # noticed in time to retry on a new one (other batches are not held up meanwhile).
        sent_at = loop.time()
        remaining = min(lease.deadline for _, lease, *_ in live) - sent_at
        timeout = max(remaining / 2, 0.005)
        keys = [entry.key for entry, *_ in live]
        args: list[str | int] = []
        for entry, lease, ttl_ms, _ in live:
            args += (entry.token, ttl_ms, entry.kind)
            lease._renewal_sent(sent_at, ttl_ms / 1000)
        self.batches_sent += 1
        # With leases that need replicas (`replicas=N`), a WAIT for the most any of them
        # needs follows the batch; each is confirmed if enough replicas acknowledged.
        needed = max(entry.replicas for entry, *_ in live)
        wait = None
        if needed:
            patience = min(e.replica_timeout for e, *_ in live if e.replicas)
            wait = (needed, replica_wait_ms(patience, timeout))
        acked = 0
        try:
            if self._backend.cluster:
                replies = await self._renew_per_slot(live, args, timeout)
            else:
                replies = await self._backend.run(
                    RENEW,
                    keys,
                    args,
                    CallOptions(
                        timeout=timeout,
                        operation="renew",
                        name=None,
                        background=True,
                        wait=wait,
                        votes=RENEW_VOTES,  # on a quorum, each lease by its own votes
                    ),
                )
            if wait is not None:
                replies, acked = replies
        except BackendError as exc:
            self._failed(live, exc, sent_at)
            return
        except asyncio.CancelledError:
            for _, lease, ttl_ms, _ in live:
                lease._renewal_answered(sent_at, ttl_ms / 1000)
            raise
        except Exception as exc:  # a bug must not stop renewals silently
            logger.exception("aiolock: unexpected error while renewing %d leases", len(live))
            error = BackendError(f"renew failed: {exc!r}", operation="renew", name=None)
            self._failed(live, error, sent_at)
            return
        self._answered(live, replies, acked, sent_at, needed)

    def _answered(
        self, live: list[_Live], replies: Sequence[Any], acked: int, sent_at: float, needed: int
    ) -> None:
        """A batch sent at `sent_at` was answered `replies` (with `acked` replicas'
        acknowledgement): each lease is renewed, lost, or (not confirmed by enough
        replicas) retried like a failed batch."""
        short: list[_Live] = []
        for (entry, lease, ttl_ms, last), reply in zip(live, replies, strict=True):
            if int(reply) == 1 and acked < entry.replicas:
                short.append((entry, lease, ttl_ms, last))  # applied, but not confirmed: retried
                continue
            lease._renewal_answered(sent_at, ttl_ms / 1000)
            if not entry.active:
                continue  # released while the batch was in flight
            if int(reply) == 1:
                if entry.backoff is not None:
                    entry.backoff.reset()
                lease._renewed(sent_at, ttl_ms / 1000)
                if last:  # renewed up to max_hold: the last renewal
                    self.remove(entry)
                    lease._renewal_stopped()
                else:
                    self._reschedule(entry, renewal.next_due(sent_at, entry.interval, self.rng))
            else:
                self.remove(entry)
                lease._not_owner()
        if short:
            error = ReplicationError(
                f"renew: {acked} replicas acknowledged within the wait, "
                f"{max(entry.replicas for entry, *_ in short)} required",
                operation="renew",
                replicas=needed,
                acknowledged=acked,
            )
            self._failed(short, error, sent_at)

    async def _renew_per_slot(
        self, live: list[_Live], args: list[str | int], timeout: float
    ) -> list[Any]:
        """On a cluster, a script's keys must share one slot: one RENEW call per slot,
        sent in one round trip per node; the replies in `live`'s order."""
        by_slot: dict[int, list[int]] = {}
        for index, (entry, *_) in enumerate(live):
            by_slot.setdefault(self._backend.slot(entry.key), []).append(index)
        groups = list(by_slot.values())
        calls = [
            ([live[i][0].key for i in group], [a for i in group for a in args[3 * i : 3 * i + 3]])
            for group in groups
        ]
        answers = await self._backend.run_each(
            RENEW, calls, timeout=timeout, operation="renew", split=_one_call_per_key
        )
        replies: list[Any] = [0] * len(live)
        for group, answer in zip(groups, answers, strict=True):
            for index, reply in zip(group, answer, strict=True):
                replies[index] = reply
        return replies

    def _failed(self, live: list[_Live], exc: BackendError, sent_at: float) -> None:
        now = self._backend.loop.time()
        for entry, lease, ttl_ms, _ in live:
            lease._renewal_answered(sent_at, ttl_ms / 1000)
            if entry.active:
                lease._renew_failed(exc)
                if entry.backoff is None:
                    entry.backoff = renewal.failure_backoff(entry.interval, self.rng)
                self._reschedule(entry, now + entry.backoff.next())

    async def _release_abandoned(self, entry: RenewalEntry) -> None:
        try:
            await entry.release()
        except BackendError as exc:
            logger.warning("aiolock: could not release an abandoned lease: %s", exc)
        except Exception:  # a bug must not stop renewals silently
            logger.exception("aiolock: unexpected error while releasing an abandoned lease")
