"""The renewal policy: when a lease is renewed, for how long, and what counts as a renewal.

Every timing decision about renewals is made here, by pure functions of the times and
settings they are given (no clock read, no I/O); the engine, the lease and the watchdog
ask them and carry out the answer:

- the cadence: the default interval (a third of the ttl), the first renewal of a lease
  (`first_due`), the next after a renewal (`next_due`, spread so that leases drift into
  shared batches), and which leases share a batch (`batch_window`);
- the caps: the safety margin taken off every validity (`safety_margin`), and the expiry a
  renewal sets near `max_hold` (`capped_ttl_ms`, `stop_at`);
- the backoff of a failed renewal (`failure_backoff`);
- what counts as a renewal of a lease, and until when it is valid (`Validity`);
- the lease taken from a grant (`grant_timing`): whether it can be taken without an
  acquire, until when it is valid, when it is first renewed, and whether that renewal is
  written before `acquire()` returns (`first_renewal`); a replicated grant is confirmed
  the same way, with the replicas' acknowledgement awaited.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass

from .._aio.backoff import Backoff

__all__ = (
    "FirstRenewal",
    "GrantTiming",
    "Validity",
    "batch_window",
    "capped_ttl_ms",
    "default_interval",
    "failure_backoff",
    "first_due",
    "first_renewal",
    "grant_timing",
    "next_due",
    "renews_at_once",
    "safety_margin",
    "stop_at",
)


def safety_margin(ttl: float) -> float:
    """Seconds subtracted from a lease's validity: clock drift (1 %) plus 2 ms.

    The 2 ms cover Redis's millisecond expiry precision and event-loop scheduling delay;
    the 1 % covers rate differences between this machine's monotonic clock and the server's
    wall clock. Never more than half the ttl.
    """
    return min(ttl * 0.01 + 0.002, ttl / 2)


def default_interval(ttl: float) -> float:
    """The renewal interval when none is given: a third of the ttl."""
    return ttl / 3


def first_due(sent_at: float, interval: float | None) -> float | None:
    """When a lease acquired by a request sent at `sent_at` is first renewed (None: never)."""
    return None if interval is None else sent_at + interval


def next_due(sent_at: float, interval: float, rng: random.Random) -> float:
    """When a lease renewed by a batch sent at `sent_at` is renewed next: a little before
    its interval, at random, so that leases drift together into shared batches."""
    return sent_at + interval * rng.uniform(0.9, 1.0)


def batch_window(interval: float) -> float:
    """How far ahead of its due time a lease joins a batch being sent."""
    return interval / 4


def stop_at(sent_at: float, max_hold: float | None) -> float | None:
    """When renewals of a lease acquired at `sent_at` stop (None: never)."""
    return None if max_hold is None else sent_at + max_hold


def capped_ttl_ms(ttl_ms: int, stop: float | None, now: float) -> int:
    """The expiry a renewal sets at `now`: the ttl, or less once `stop` is nearer (0: stop)."""
    if stop is None:
        return ttl_ms
    return max(0, min(ttl_ms, math.floor((stop - now) * 1000)))


def failure_backoff(interval: float, rng: random.Random) -> Backoff:
    """The backoff of a lease's renewals after a failed batch."""
    return Backoff(base=min(0.05, interval / 4), cap=interval / 2, rng=rng)


@dataclass(frozen=True, slots=True)
class GrantTiming:
    """How a lease taken from a grant is counted (see `grant_timing`)."""

    deadline: float
    first_due: float


def grant_timing(
    now: float, sent_at: float, expiry_ms: int, *, ttl: float, interval: float | None
) -> GrantTiming | None:
    """The timing of a lease taken from a grant made after `sent_at` with its expiry, or
    None if it must first be claimed by an acquire.

    The grant's expiry is the full ttl when this process granted it to itself, else at most
    RESERVATION_MS: the lease is valid until then, or for the primitive's ttl if that is
    shorter (its renewals set that), minus the margin. It is taken only with at least half
    of that left, and only by a primitive that renews (`interval`). It is renewed by the
    watchdog within a third of its validity (and at once if `renews_at_once`).
    """
    if interval is None:
        return None
    validity = min(expiry_ms / 1000, ttl)
    if now >= sent_at + validity / 2:
        return None
    return GrantTiming(
        deadline=sent_at + validity - safety_margin(validity),
        first_due=sent_at + min(interval, validity / 3),
    )


def renews_at_once(expiry_ms: int, ttl_ms: int) -> bool:
    """Whether a lease taken from a grant with this expiry is renewed to its full ttl
    before `acquire()` returns: a grant shorter than the ttl (another process's release).
    A grant of the full ttl (this process's own release) is left to the watchdog, however
    late it was heard of."""
    return expiry_ms < ttl_ms


class FirstRenewal(enum.Enum):
    """What is done with a lease taken from a grant before `acquire()` returns."""

    LEFT = "left"
    """Nothing: the watchdog renews it on its schedule."""
    WRITTEN = "written"
    """Its renewal to the full ttl is written (its answer not awaited)."""
    CONFIRMED = "confirmed"
    """Its renewal to the full ttl and a WAIT for the replicas are awaited: the grant
    counts only once the replicas have it."""


def first_renewal(
    expiry_ms: int, ttl_ms: int, *, replicas: int, at_once: bool = True
) -> FirstRenewal:
    """The first renewal of a lease taken from a grant with this expiry: confirmed by the
    replicas if the primitive needs any (a grant written by any release), else written at
    once if `renews_at_once` and the primitive asks for it (`at_once`: its
    `renew_on_handoff`), else left to the watchdog."""
    if replicas:
        return FirstRenewal.CONFIRMED
    if at_once and renews_at_once(expiry_ms, ttl_ms):
        return FirstRenewal.WRITTEN
    return FirstRenewal.LEFT


class Validity:
    """How long one lease is valid, as its renewals say: the policy's account of a lease
    (every time is given, no clock is read). The lease asks it and arms its timer.

    A renewal counts from when it was *sent*: confirmed, it moves the deadline to its send
    time + the expiry it set minus the margin. Renewals sent and not answered yet are kept: one
    of them may already be confirmed by Redis when the deadline is noticed (its reply not
    read yet), and so rescues the lease (`rescues`). A new ttl (`retarget`) counts the
    shorter of it and the expiries still in flight until they are answered, and a renewal
    sent before it is not counted.
    """

    __slots__ = ("deadline", "in_flight", "margin", "retargeted_at", "ttl")

    def __init__(
        self, *, sent_at: float, ttl: float, margin: float, deadline: float | None = None
    ) -> None:
        self.ttl = ttl
        self.margin = margin
        self.in_flight: list[tuple[float, float]] = []  # (sent at, ttl) of each renewal
        self.retargeted_at = -math.inf  # when extend(ttl=...) last set a new ttl
        # A lease granted directly starts with the grant's shorter validity, until renewed.
        self.deadline = sent_at + ttl - margin if deadline is None else deadline

    def sent(self, sent_at: float, ttl: float) -> None:
        """A renewal setting the expiry to `ttl` was sent at `sent_at`."""
        self.in_flight.append((sent_at, ttl))

    def answered(self, sent_at: float, ttl: float) -> None:
        """The renewal sent at `sent_at` setting the expiry to `ttl` was answered (or
        failed, or was given up). Two renewals may be sent at one reading of the clock
        (uvloop's counts whole milliseconds): the expiry tells them apart."""
        for index, renewal in enumerate(self.in_flight):
            if renewal == (sent_at, ttl):
                del self.in_flight[index]
                return

    def counts(self, sent_at: float) -> bool:
        """Whether a renewal sent at `sent_at` counts: not sent with the ttl the lease had
        before `retarget`."""
        return sent_at >= self.retargeted_at

    def renewed(self, sent_at: float, ttl: float | None) -> bool:
        """A renewal sent at `sent_at` set the expiry to `ttl` (None: the lease's): True if
        the deadline moved."""
        deadline = sent_at + (self.ttl if ttl is None else ttl) - self.margin
        if deadline > self.deadline:
            self.deadline = deadline
            return True
        return False

    def retarget(self, ttl: float, sent_at: float) -> None:
        """The expiry was set to a new `ttl` by a request sent at `sent_at`: the lease has
        that ttl from now on (its deadline may move back)."""
        shortest = min([ttl, *(old for _, old in self.in_flight)])
        self.ttl = ttl
        self.margin = safety_margin(ttl)
        self.retargeted_at = sent_at
        self.deadline = sent_at + shortest - safety_margin(shortest)

    def rescues(self, now: float) -> bool:
        """Whether a renewal sent in time is unanswered: if Redis confirmed it, the lease
        is valid past `now`."""
        return any(sent + ttl - self.margin > now for sent, ttl in self.in_flight)
