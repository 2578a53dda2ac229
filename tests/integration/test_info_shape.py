"""One statistics shape: `holders`, `waiting` and `free` in every primitive's `info()`, and
`ReadWriteLock.locked()`."""

from __future__ import annotations

import asyncio

import redis.asyncio

from aiolock import Lease, Lock, LockInfo, ReadWriteInfo, ReadWriteLock, Semaphore, SemaphoreInfo

from ..support.waits import eventually


async def test_a_locks_info_counts_the_tasks_waiting(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=10)
    async with lock:
        info = await lock.info()
        assert info is not None
        assert (info.holders, info.waiting, info.free) == ((info,), 0, 0)
        waiters = [asyncio.create_task(Lock(client, name).acquire(timeout=10)) for _ in range(2)]

        async def two_waiting() -> bool:
            found = await lock.info()
            return found is not None and found.waiting == 2

        await eventually(two_waiting, what="two tasks waiting", interval=0.01)
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    assert await lock.info() is None


async def test_every_info_has_holders_waiting_and_free(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock, semaphore = Lock(client, name), Semaphore(client, name, limit=2)
    rw = ReadWriteLock(client, name)
    async with lock as lease, semaphore as permit, rw.read() as read:
        infos: list[LockInfo | SemaphoreInfo | ReadWriteInfo | None] = [
            await lock.info(),
            await semaphore.info(),
            await rw.info(),
        ]
        for info, held, free in zip(infos, (lease, permit, read), (0, 1, 0), strict=True):
            assert info is not None
            assert [h.fencing_token for h in info.holders] == [held.fencing_token]
            assert (info.waiting, info.free) == (0, free)


async def test_a_read_write_locks_info_and_locked(client: redis.asyncio.Redis, name: str) -> None:
    rw = ReadWriteLock(client, name, ttl=10)
    info = await rw.info()
    assert (info.holders, info.waiting, info.free) == ((), 0, 1)
    assert not await rw.locked()
    first = await rw.read().acquire()
    second = await rw.read().acquire(timeout=0)  # a second reader of this task: no wait
    info = await rw.info()
    assert info.holders == info.readers
    assert {h.fencing_token for h in info.holders} == {first.fencing_token, second.fencing_token}
    assert info.free == 0
    assert await rw.locked()
    writer = asyncio.create_task(rw.write().acquire(timeout=10))

    async def writer_waiting() -> bool:
        return (await rw.info()).waiting == 1

    await eventually(writer_waiting, what="a writer waiting", interval=0.01)
    assert (await rw.info()).writers_waiting == 1
    await first.release()
    await second.release()
    lease: Lease = await writer
    async with lease:
        info = await rw.info()
        assert info.holders == (info.writer,)
        assert (info.waiting, info.free) == (0, 0)
        assert await rw.locked()
    assert not await rw.locked()
