"""`hold_elsewhere` and `expire_now` for every primitive: a lock, a semaphore's permits, a
read-write lock's writer and readers; on a real server and on fakeredis."""

from __future__ import annotations

import pytest
import redis.asyncio

from aiolock import (
    AcquireTimeoutError,
    ConfigError,
    Lease,
    Lock,
    LossReason,
    ReadWriteLock,
    Semaphore,
)
from aiolock.testing import expire_now, hold_elsewhere

from ..conftest import CommandLog
from ..support.load import scaled
from ..support.waits import within


async def lost(lease: Lease) -> None:
    """Wait until `lease` is lost at a renewal (its key or field expired under it)."""
    error = await within(lease.wait_lost(), what=f"{lease!r} lost")
    assert error is not None
    assert lease.loss_reason is LossReason.NOT_OWNER


async def test_expire_now_a_semaphores_permits(client: redis.asyncio.Redis, name: str) -> None:
    sem = Semaphore(client, name, limit=3, ttl=scaled(0.3))
    first, second = await sem.acquire(), await sem.acquire()
    assert (first.slot, second.slot) == (0, 1)
    assert await expire_now(client, sem, slot=1)  # the permit in slot 1 only
    await lost(second)
    await first.extend()  # still held
    assert not await expire_now(client, sem, slot=1)  # nobody in slot 1 now
    assert not await expire_now(client, sem, slot=2)
    third = await sem.acquire()
    assert await expire_now(client, sem)  # every permit
    await lost(first)
    await lost(third)
    assert not await expire_now(client, sem)
    assert (await sem.info()).holders == ()  # free again: the permits expired
    async with sem as again:
        assert again.slot == 0


async def test_expire_now_a_read_write_locks_writer_or_readers(
    client: redis.asyncio.Redis, name: str
) -> None:
    rw = ReadWriteLock(client, name, ttl=scaled(0.3))
    writer = await rw.write().acquire()
    assert not await expire_now(client, rw.read())  # no reader to expire
    assert writer.held
    assert await expire_now(client, rw.write())
    await lost(writer)
    readers = [await rw.read().acquire() for _ in range(2)]
    assert not await expire_now(client, rw.write())
    assert await expire_now(client, rw.read())  # every reader
    for reader in readers:
        await lost(reader)
    async with rw.write():  # free again
        pass


async def test_expire_now_a_lock_as_before(client: redis.asyncio.Redis, name: str) -> None:
    lock = Lock(client, name, ttl=scaled(0.3))
    lease = await lock.acquire()
    assert await expire_now(client, lock)
    await lost(lease)
    lease = await lock.acquire()
    assert await expire_now(client, name)  # by its name
    await lost(lease)


async def test_hold_elsewhere_every_free_permit_or_some(
    client: redis.asyncio.Redis, name: str
) -> None:
    sem = Semaphore(client, name, limit=3, ttl=5)
    async with hold_elsewhere(client, sem) as permits:
        assert sorted(p.slot or 0 for p in permits) == [0, 1, 2]
        assert await sem.try_acquire() is None  # busy for the code under test
        with pytest.raises(AcquireTimeoutError):
            await sem.acquire(timeout=0.05)
    async with hold_elsewhere(client, sem, permits=2) as permits:
        assert len(permits) == 2
        async with sem as mine:  # one left
            assert mine.slot == 2
            assert await sem.try_acquire() is None
    mine = await sem.acquire()  # some held here: the rest are taken
    async with hold_elsewhere(client, sem) as permits:
        assert len(permits) == 2
        assert await sem.try_acquire() is None
    await mine.release()
    assert (await sem.info()).holders == ()  # released at the block's end


async def test_hold_elsewhere_a_read_write_lock(client: redis.asyncio.Redis, name: str) -> None:
    rw = ReadWriteLock(client, name, ttl=5)
    async with hold_elsewhere(client, rw.write()) as writer:
        assert writer.held
        assert await rw.read().try_acquire() is None
        assert await rw.write().try_acquire() is None
    async with hold_elsewhere(client, rw.read()) as reader:
        assert reader.held
        assert await rw.write().try_acquire() is None  # a reader keeps writers out
        async with rw.read():  # but lets readers in
            pass
    async with rw.write():  # released at the block's end
        pass


async def test_hold_elsewhere_a_lock_object_or_name(client: redis.asyncio.Redis, name: str) -> None:
    lock = Lock(client, name, ttl=5, prefix="app")
    async with hold_elsewhere(client, lock) as lease:  # the Lock's own prefix
        assert lease.held
        assert await lock.try_acquire() is None
    async with hold_elsewhere(client, name, prefix="app"):
        assert await lock.try_acquire() is None
    async with lock:
        pass


async def test_hold_elsewhere_waits_for_a_busy_semaphore(
    client: redis.asyncio.Redis, name: str
) -> None:
    sem = Semaphore(client, name, limit=1, ttl=5)
    async with sem:
        with pytest.raises(AcquireTimeoutError):
            async with hold_elsewhere(client, sem, timeout=0.05):
                pass


@pytest.mark.real_only
async def test_bad_targets_and_arguments_fail_before_anything_is_sent(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    rw = ReadWriteLock(client, name)
    sem = Semaphore(client, name, limit=2)
    mark = commands.mark()
    for target in (rw, 42, b"name"):
        with pytest.raises(TypeError, match=r"^lock must be") as info:
            await expire_now(client, target)  # type: ignore[call-overload]
        assert "ReadWriteLock" in str(info.value)  # the kinds it takes
        with pytest.raises(TypeError, match=r"^name must be"):
            async with hold_elsewhere(client, target):  # type: ignore[call-overload]
                pass
    with pytest.raises(ConfigError, match="slot") as config:
        await expire_now(client, sem, slot=-1)
    assert config.value.argument == "slot"
    with pytest.raises(TypeError, match="slot"):
        await expire_now(client, Lock(client, name), slot=0)  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="permits") as config:
        async with hold_elsewhere(client, sem, permits=0):
            pass
    assert config.value.argument == "permits"
    with pytest.raises(TypeError, match="permits"):
        async with hold_elsewhere(client, rw.read(), permits=1):  # type: ignore[call-overload]
            pass
    assert commands.since(mark).total() == 0
