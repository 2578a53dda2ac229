"""A lease's account of its renewals in flight: until when it counts itself valid.

No server: the lease's issuer answers at once, and the event loop's clock is held still,
so that two renewals are sent at one reading of the clock (as on uvloop, whose clock
counts whole milliseconds, two sent in the same millisecond are).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiolock._engine.lease import Lease
from aiolock._model.renewal_policy import safety_margin


class AnswersAtOnce:
    """A lease issuer whose every extension and release is confirmed at once."""

    name = "answers-at-once"

    async def _extend_lease(self, lease: Lease, *, timeout: float, ttl_ms: int) -> bool:
        return True

    async def _release_lease(self, lease: Lease, *, timeout: float) -> bool:
        return True

    def _guarding(self, lease: Lease, task: asyncio.Task[Any], *, entered: bool) -> None:
        pass


@contextmanager
def clock_held_at(now: float) -> Iterator[None]:
    """The running loop's clock reads `now` until the block ends."""
    loop = asyncio.get_running_loop()
    setattr(loop, "time", lambda: now)  # noqa: B010 - a method of this loop object only
    try:
        yield
    finally:
        delattr(loop, "time")


def lease_of(ttl: float, *, sent_at: float) -> Lease:
    """A lease of `ttl` seconds acquired by a request sent at `sent_at`, not renewed."""
    return Lease(
        issuer=AnswersAtOnce(),
        token="ab" * 16,
        fencing_token=1,
        ttl=ttl,
        margin=safety_margin(ttl),
        sent_at=sent_at,
        scheduler=None,
        make_entry=None,
    )


async def test_an_extension_sent_with_a_renewal_at_one_reading_of_the_clock_counts_both() -> None:
    """A watchdog renewal to the old ttl (1 s) and `extend(ttl=10)` are sent at one reading
    of the clock; the extension is answered first. Redis may apply the renewal last,
    leaving the key 1 s to live: until that renewal is answered, the lease counts on no
    more than that."""
    now = 1000.0
    with clock_held_at(now):
        lease = lease_of(1.0, sent_at=now)
        lease._renewal_sent(now, 1.0)  # the watchdog's, on its way
        await lease.extend(ttl=10)
        assert lease.deadline <= now + 1.0, "counted past what the renewal in flight allows"
        await lease.release()


async def test_a_deadline_timer_run_a_clock_tick_early_loses_the_lease_after_settling() -> None:
    """The deadline timer runs before the deadline by the clock (uvloop rounds its timers
    to whole milliseconds), while a renewal sent in time is unanswered: the lease lets the
    loop read what has arrived, then, nothing confirmed, is lost. It counts the deadline
    as reached when the timer ran, not by the clock's reading after settling (still
    before the deadline): that timer had run, no other was armed, and the lease stayed
    held past its deadline, the body running, until something else looked.

    Break seen failing: the check after settling reading the clock alone."""
    loop = asyncio.get_running_loop()
    lease = lease_of(30.0, sent_at=loop.time())
    deadline = lease.deadline
    lease._renewal_sent(deadline - 0.2, 30.0)  # in time, unanswered
    with clock_held_at(deadline - 0.0005):
        lease._deadline_timer()
    assert lease.held, "lost before what had arrived was read"
    for _ in range(10):
        await asyncio.sleep(0)
    assert lease.lost, "held past its deadline, its timer spent"
