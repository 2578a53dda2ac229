"""What the client does per operation, counted: the watchdog's task outlives a wake that
finds nothing to renew, so locking in a loop starts it (and opens its connection) once.

No server: the scheduler runs on a stand-in backend that only has a loop and counts the
times its background connection is closed (each close is a connection opened again by the
next renewal).
"""

from __future__ import annotations

import asyncio

from aiolock._engine.watchdog import RenewalScheduler


class IdleBackend:
    """What the scheduler needs of a backend when nothing is held."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.closed = 0

    async def close_background_client(self) -> None:
        self.closed += 1


async def lingering(scheduler: RenewalScheduler) -> None:
    """Let the scheduler's task run until it sleeps in its idle moment."""
    for _ in range(10):
        await asyncio.sleep(0)
        if scheduler._wakeup is not None:
            return
    raise AssertionError("the scheduler never went to sleep")


async def test_a_wake_with_nothing_to_renew_does_not_end_the_idle_moment() -> None:
    """A lease added and released before the scheduler's task ran (one taken from a
    grant, its first renewal due early, wakes it) leaves nothing to renew: the task sleeps
    on to the end of its idle moment instead of ending, closing its connection, and being
    started again for the next lease."""
    backend = IdleBackend()
    scheduler = RenewalScheduler(backend)  # type: ignore[arg-type]
    scheduler._ensure_running()
    task = scheduler._task
    assert task is not None
    for _ in range(3):
        await lingering(scheduler)
        scheduler._wake()
    await lingering(scheduler)
    assert scheduler._task is task and not task.done()
    assert backend.closed == 0
    task.cancel()
    await asyncio.wait({task})
    assert backend.closed == 1
    assert scheduler._task is None
