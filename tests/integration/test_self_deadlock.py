"""A task that already holds a lock in an `async with` block cannot wait for it again.

Waiting would last forever (or the whole timeout): it is refused with `RuntimeError` before
anything is sent. What cannot be seen is documented on `Lock.acquire`.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from aiolock import AcquireTimeoutError, Lock

from ..conftest import CommandLog

HANG = 5.0
"""A refused call returns at once; one still waiting after this long would wait forever."""


async def test_acquire_in_the_task_that_holds_the_lock_is_refused(
    client: redis.asyncio.Redis, name: str, commands: CommandLog
) -> None:
    lock = Lock(client, name, ttl=5)
    async with lock:
        mark = commands.mark()
        with pytest.raises(RuntimeError, match="already held by this task"):
            async with asyncio.timeout(HANG):  # in this task: wait_for would use another
                await lock.acquire()
        with pytest.raises(RuntimeError, match="already held by this task"):
            async with asyncio.timeout(HANG):
                await lock.acquire(timeout=1)
        assert commands.since(mark) == {}, "nothing may be sent"
        assert await lock.try_acquire() is None  # a single try never waits: it is allowed
        assert await lock.locked()
    assert not await lock.locked()


async def test_a_second_lock_object_of_the_same_name_nested_is_refused(
    client: redis.asyncio.Redis, name: str, commands: CommandLog
) -> None:
    async with Lock(client, name, ttl=5):
        mark = commands.mark()
        with pytest.raises(RuntimeError, match="already held by this task"):
            async with asyncio.timeout(HANG), Lock(client, name, ttl=5, timeout=None):
                pytest.fail("must not run")
        assert commands.since(mark) == {}


async def test_a_lease_entered_by_hand_counts_too(client: redis.asyncio.Redis, name: str) -> None:
    lease = await Lock(client, name, ttl=5).acquire()
    async with lease:
        with pytest.raises(RuntimeError, match="already held by this task"):
            async with asyncio.timeout(HANG):
                await Lock(client, name, ttl=5).acquire(timeout=None)
    # Released with the block: the name is free for this task again.
    again = await Lock(client, name, ttl=5).acquire(timeout=0)
    await again.release()


async def test_other_tasks_and_other_names_still_wait_or_acquire(
    client: redis.asyncio.Redis, name: str
) -> None:
    async with Lock(client, name, ttl=5):
        other = await Lock(client, f"{name}:other", ttl=5).acquire(timeout=0)
        await other.release()
        elsewhere = asyncio.create_task(Lock(client, name, ttl=5).acquire(timeout=0.05))
        with pytest.raises(AcquireTimeoutError):
            await elsewhere


async def test_a_lease_held_outside_a_block_may_be_waited_for(
    client: redis.asyncio.Redis, name: str
) -> None:
    """A lease from acquire() is not bound to a task (it may be handed to another one), so
    the same task may wait for it: here another task releases it."""
    lease = await Lock(client, name, ttl=5).acquire()
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, lambda: loop.create_task(lease.release()))
    again = await Lock(client, name, ttl=5).acquire(timeout=5)
    await again.release()
