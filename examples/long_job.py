"""A job five times longer than its lock's ttl, kept alive; then a stall that loses it.

    python examples/long_job.py

1. A 1 s-ttl lock held for 5 s: the watchdog renews it every ttl/3, the job sees its
   lease's remaining validity go down and back up, and finishes protected.
2. The same job, but its event loop is blocked for longer than the ttl (a synchronous call,
   a long GC pause): no renewal could run, the lease's deadline passed. At its next
   `await` the job is cancelled, `async with` raises `LeaseLostError` (reason DEADLINE),
   and the steps after it never run. But that `await` itself may already have sent a
   command: the job checks `lease.held` before a write that matters, and fences the
   others (see fenced_storage.py), since another process may hold the lock by then.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio
from _server import check, redis_url

from aiolock import LeaseLostError, Lock, LossReason

TTL = 1.0
STEP = 0.5


async def long_job(db: redis.asyncio.Redis) -> float:
    started = time.monotonic()
    async with Lock(db, "reports:long-job", ttl=TTL) as lease:
        for step in range(10):
            await asyncio.sleep(STEP)  # a step of real work, half as long as the ttl
            print(
                f"  step {step + 1}/10 at {time.monotonic() - started:.1f}s: {lease.remaining():.2f}s of validity left"
            )
    return time.monotonic() - started


async def stalled_job(db: redis.asyncio.Redis) -> tuple[LossReason | None, list[str]]:
    steps: list[str] = []
    try:
        async with Lock(db, "reports:stalled-job", ttl=TTL) as lease:
            steps.append("started")
            time.sleep(2 * TTL)  # noqa: ASYNC251 - blocks the event loop on purpose
            # The deadline has passed, but the loop has not yet run the timer that marks
            # the loss and cancels this block: `held` already says so, `lost` not yet.
            print(f"  after the stall: lease.held={lease.held}, lease.lost={lease.lost}")
            if lease.held:  # the check to make right before a write that matters
                await db.set("reports:stalled-job:checked", "written without the lock")
            # An unchecked write is sent before the cancellation lands: fence such writes.
            await db.set("reports:stalled-job:unchecked", "written without the lock")
            steps.append("went on after the stall")
    except LeaseLostError as error:
        print(f"  the job got: {type(error).__name__}: {error}")
        return error.reason, steps
    return None, steps


async def main() -> None:
    async with redis_url() as url:
        db = redis.asyncio.Redis.from_url(url)
        try:
            await db.delete("reports:stalled-job:checked", "reports:stalled-job:unchecked")
            print(f"1. a 10 x {STEP}s job under a {TTL}s-ttl lock:")
            took = await long_job(db)
            print(f"  finished after {took:.1f}s, protected all along")
            print(f"2. the event loop blocked for {2 * TTL}s under a {TTL}s-ttl lock:")
            reason, steps = await stalled_job(db)
            checked = await db.exists("reports:stalled-job:checked")
            unchecked = await db.exists("reports:stalled-job:unchecked")
            print(f"  checked write made: {bool(checked)}; unchecked write made: {bool(unchecked)}")
        finally:
            await db.aclose()
    check(took >= 10 * STEP, "the job outlived its ttl five times, kept by the watchdog")
    check(
        reason is LossReason.DEADLINE and steps == ["started"] and not checked,
        "the stall lost the lease (DEADLINE); the checked write and the steps after did not run",
    )


if __name__ == "__main__":
    asyncio.run(main())
