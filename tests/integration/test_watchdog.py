"""The watchdog: renewal batches, abandoned leases, re-entrancy."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest
import redis.asyncio

from aiolock import Lock
from aiolock._runtime import runtime_for


async def test_a_garbage_collected_lease_warns_and_is_released(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=30)
    lease = await lock.acquire()
    assert await lock.locked()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del lease
        gc.collect()
    assert any(
        issubclass(w.category, ResourceWarning) and "garbage-collected" in str(w.message)
        for w in caught
    )
    # The scheduler releases the abandoned key instead of letting it block for 30 s.
    async with asyncio.timeout(5):
        while await lock.locked():
            await asyncio.sleep(0.01)
    await runtime_for(client).scheduler.wait_idle()


async def test_entering_a_held_lock_again_in_the_same_task_raises(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5)
    async with lock:
        with pytest.raises(RuntimeError, match="not reentrant"):
            async with lock:
                pytest.fail("must not run")
        assert await lock.locked()
    assert not await lock.locked()


async def test_renewal_stops_when_every_lease_is_released(
    client: redis.asyncio.Redis, name: str
) -> None:
    scheduler = runtime_for(client).scheduler
    leases = [await Lock(client, f"{name}:{i}", ttl=0.2).acquire() for i in range(10)]
    assert scheduler.active == 10
    for lease in leases:
        await lease.release()
    assert scheduler.active == 0
    await asyncio.wait_for(scheduler.wait_idle(), 5)
    assert not scheduler.running
