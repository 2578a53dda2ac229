"""How busy the machine is now, for the tests whose outcome depends on the event loop (or a
server) getting a CPU on time: a lease whose ttl is shorter than a stall of the loop is lost,
as it should be, and such a test's ttl must outlast the stalls the machine causes.

`slack()` is 1 on an idle machine and grows with CPU contention, up to `MAX_SLACK`: the
share of the last 10 seconds in which some task waited for a CPU (`/proc/pressure/cpu`,
Linux's pressure-stall information), else the 1-minute load average per CPU. A test scales
its ttls and its bounds by it (`scaled(1.0)`); none is removed. What a test checks (a loss,
an order, a count) stays the same; only how long it may take changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

MAX_SLACK: Final = 4.0
PRESSURE = Path("/proc/pressure/cpu")


def _pressure() -> float | None:
    """The share (0 to 1) of the last 10 s in which some runnable task waited for a CPU."""
    try:
        first = PRESSURE.read_text().splitlines()[0]  # "some avg10=4.15 avg60=... total=..."
        fields = dict(part.split("=", 1) for part in first.split()[1:])
        return float(fields["avg10"]) / 100
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _load() -> float:
    """How contended the CPUs are, from 0 (idle) to 1 (heavily)."""
    pressure = _pressure()
    if pressure is not None:
        return min(1.0, pressure / 0.5)
    try:
        per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0
    return min(1.0, max(0.0, per_cpu - 1.0) / 2)


def slack() -> float:
    """A factor from 1 (idle) to `MAX_SLACK` (CPUs contended half the time or more)."""
    return 1.0 + (MAX_SLACK - 1.0) * _load()


def scaled(seconds: float) -> float:
    """`seconds` times `slack()`, rounded to the millisecond."""
    return round(seconds * slack(), 3)


class LoopLag:
    """How long a busy machine kept this event loop from running, while watched: a timer
    ticks every `every` seconds, and each tick later than that by more than `grace` (the
    loop's own timer granularity) adds its lateness to `total`."""

    def __init__(self, every: float = 0.01, grace: float = 0.002) -> None:
        self.every = every
        self.grace = grace
        self.total = 0.0

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.every)
            self.total += max(0.0, loop.time() - before - self.every - self.grace)


@contextlib.asynccontextmanager
async def loop_lag() -> AsyncIterator[LoopLag]:
    """A `LoopLag` measuring while the block runs."""
    lag = LoopLag()
    task = asyncio.create_task(lag._tick())
    try:
        yield lag
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
