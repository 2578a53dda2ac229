"""Reading the layout back (SCAN, snapshots, force release, hold_stats), on both backends."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket

import pytest
import redis.asyncio

import aiolock
from aiolock import LeaseLostError, Lock, LockInfo, LossReason, ReadWriteLock, Semaphore
from aiolock._lua.layout import LockKeys
from aiolock._model.hold_stats import recommend_ttl_ms
from aiolock._ops.inspection import force_release, read_locks, scan_lock_names

from ..support.load import scaled
from ..support.waits import within
from .conftest import eventually


async def test_scan_finds_held_locks_by_pattern_and_prefix(
    client: redis.asyncio.Redis, tag: str
) -> None:
    a = await Lock(client, f"{tag}:orders:1", ttl=5).acquire()
    b = await Lock(client, f"{tag}:orders:2", ttl=5).acquire()
    other = await Lock(client, f"{tag}:orders:3", ttl=5, prefix="elsewhere").acquire()
    released = await Lock(client, f"{tag}:reports", ttl=5).acquire()
    await released.release()
    # Holds recorded, state gone (it expired): found only when asked for.
    recorded = await Lock(client, f"{tag}:stats", ttl=5, hold_stats=True).acquire()
    await recorded.release()
    await client.delete(LockKeys.build("aiolock", f"{tag}:stats").lock)
    try:
        # A released lock's state is kept for a while (its last fencing token): found too.
        assert await scan_lock_names(client, pattern=f"{tag}:*") == [
            f"{tag}:orders:1",
            f"{tag}:orders:2",
            f"{tag}:reports",
        ]
        assert await scan_lock_names(client, pattern=f"{tag}:orders:1") == [f"{tag}:orders:1"]
        assert await scan_lock_names(client, pattern=f"{tag}:*", prefix="elsewhere") == [
            f"{tag}:orders:3"
        ]
        assert await scan_lock_names(client, pattern=f"{tag}:*", with_holds=True) == [
            f"{tag}:orders:1",
            f"{tag}:orders:2",
            f"{tag}:reports",
            f"{tag}:stats",
        ]
    finally:
        for lease in (a, b, other):
            await lease.release()


async def test_snapshot_of_a_held_lock_with_a_queue(client: redis.asyncio.Redis, tag: str) -> None:
    name = f"{tag}:orders"
    lock = Lock(client, name, ttl=5, hold_stats=True)
    for _ in range(3):
        async with lock:
            pass
    lease = await lock.acquire()
    waiters = [asyncio.create_task(lock.acquire()) for _ in range(2)]

    async def queued() -> bool:
        (state,) = await read_locks(client, [name])
        return state.waiters == 2

    try:
        await eventually(queued, what="two waiters read back")
        (state,) = await read_locks(client, [name])
        info = await lock.info()
        assert state.holder is not None and info is not None
        # The same LockInfo as Lock.info(), read a moment later.
        assert dataclasses.replace(state.holder, expires_in=info.expires_in) == info
        assert state.holder.fencing_token == lease.fencing_token
        assert state.holder.host == socket.gethostname()[:255]
        assert state.holder.pid == os.getpid()
        assert state.state == "held"
        assert state.last_fencing_token == lease.fencing_token
        assert state.age is not None and 0 <= state.age < 5
        assert len(state.queue) == 1  # one entry per process, counting its waiters
        (entry,) = state.queue
        assert (entry.position, entry.count, entry.pid) == (1, 2, os.getpid())
        assert 0 < entry.expires_in <= 5 + 2 + 1
        assert len(state.holds_ms) == 3
        assert state.reservation is None
    finally:
        await lease.release()
        for next_holder in asyncio.as_completed(waiters):  # in whatever order they win
            await (await next_holder).release()
    (state,) = await read_locks(client, [name])
    assert state.state == "free" and state.known
    assert len(state.holds_ms) == 6
    # Two releases handed the lock on: the typical hold is known.
    assert state.typical_hold is not None and 0 <= state.typical_hold < 5


async def test_snapshot_of_an_unknown_lock(client: redis.asyncio.Redis, tag: str) -> None:
    (state,) = await read_locks(client, [f"{tag}:never"])
    assert state.state == "free"
    assert not state.known
    assert state.hold_stats().count == 0


async def test_force_release_evicts_and_hands_over(client: redis.asyncio.Redis, tag: str) -> None:
    name = f"{tag}:stuck"
    stuck = await Lock(client, name, ttl=5).acquire()
    waiter = asyncio.create_task(Lock(client, name, ttl=5).acquire())

    async def queued() -> bool:
        (state,) = await read_locks(client, [name])
        return state.waiters == 1

    await eventually(queued, what="the waiter read back")
    result = await force_release(client, name)
    assert result.outcome == "released"
    assert result.holder is not None and result.holder.fencing_token == stuck.fencing_token
    assert result.handed_to is not None  # the queued waiter's process
    successor = await within(waiter, what="the waiter to get the released lock")
    assert successor.fencing_token > stuck.fencing_token
    with pytest.raises(LeaseLostError) as lost:
        await stuck.extend()  # what its watchdog would find at the next renewal
    assert lost.value.reason is LossReason.NOT_OWNER
    await successor.release()
    assert (await force_release(client, name)).outcome == "not_held"


async def test_force_release_never_evicts_a_new_holder(
    client: redis.asyncio.Redis, tag: str
) -> None:
    name = f"{tag}:changing"
    first = await Lock(client, name, ttl=5).acquire()
    second: list[aiolock.Lease] = []

    async def holder_changes_while_asking(holder: LockInfo) -> bool:
        assert holder.fencing_token == first.fencing_token
        await first.release()
        second.append(await Lock(client, name, ttl=5).acquire())
        return True

    result = await force_release(client, name, confirm=holder_changes_while_asking)
    assert result.outcome == "holder_changed"
    assert result.holder is not None and result.holder.fencing_token == first.fencing_token
    (lease,) = second
    info = await Lock(client, name).info()
    assert info is not None and info.fencing_token == lease.fencing_token  # still held
    await lease.extend()
    await lease.release()


async def test_force_release_declined_changes_nothing(
    client: redis.asyncio.Redis, tag: str
) -> None:
    name = f"{tag}:kept"
    lease = await Lock(client, name, ttl=5).acquire()

    async def no(holder: LockInfo) -> bool:
        return False

    assert (await force_release(client, name, confirm=no)).outcome == "declined"
    await lease.extend()
    await lease.release()


async def test_hold_stats_api(client: redis.asyncio.Redis, tag: str) -> None:
    name = f"{tag}:api"
    empty = await aiolock.hold_stats(client, name)
    assert (empty.count, empty.p99, empty.recommended_ttl) == (0, None, None)
    lock = Lock(client, name, ttl=5, hold_stats=True)
    for _ in range(5):
        async with lock:
            pass
    stats = await aiolock.hold_stats(client, name)
    assert stats.count == 5
    assert stats.name == name
    assert stats.ttl is None  # not held, and no ttl given
    assert stats.p50 is not None and stats.p99 is not None and stats.max is not None
    assert 0 <= stats.p50 <= stats.p99 <= stats.max < 5
    assert stats.recommended_ttl is None  # renewed leases: their holds do not set the ttl
    assert not stats.near_ttl and stats.fixed == 0
    async with lock:
        assert (await aiolock.hold_stats(client, name)).ttl == 5.0  # the holder's
        assert (await aiolock.hold_stats(client, name, ttl=7)).ttl == 7  # the caller's wins


async def test_holds_without_renewal_approaching_the_ttl_are_flagged(
    client: redis.asyncio.Redis, tag: str
) -> None:
    name = f"{tag}:slow"
    lock = Lock(client, name, ttl=0.5, renew=False, hold_stats=True)
    async with lock as lease:
        await asyncio.sleep(0.3)
    assert lease.released
    stats = await aiolock.hold_stats(client, name, ttl=0.5)
    assert stats.count == 1 and stats.fixed == 1 and stats.near_ttl
    assert stats.fixed_p99 is not None and stats.fixed_p99 >= 0.3
    # 3 x the hold, rounded up (1.0 for a hold of 0.3 s; more if a loaded machine made it
    # longer): what `recommend_ttl_ms` gives for the hold measured.
    assert stats.recommended_ttl == recommend_ttl_ms(round(stats.fixed_p99 * 1000)) / 1000
    assert stats.recommended_ttl >= 1.0


async def test_renewed_holds_outliving_the_ttl_are_not_flagged(
    client: redis.asyncio.Redis, tag: str
) -> None:
    name = f"{tag}:renewed"
    ttl = scaled(0.1)  # judged against 0.1 s below; longer than a loaded machine's stalls
    async with Lock(client, name, ttl=ttl, hold_stats=True) as lease:  # kept by the watchdog
        await asyncio.sleep(ttl * 1.5)
    assert lease.released
    stats = await aiolock.hold_stats(client, name, ttl=0.1)
    assert (stats.count, stats.fixed, stats.over_ttl) == (1, 0, 1)
    assert stats.p99 is not None and stats.p99 >= 0.15
    assert not stats.near_ttl and stats.recommended_ttl is None


async def test_the_evicted_holders_own_release_reports_the_loss(
    client: redis.asyncio.Redis, tag: str
) -> None:
    name = f"{tag}:evicted"
    lease = await Lock(client, name, ttl=5).acquire()
    assert (await force_release(client, name)).outcome == "released"
    # The release script keeps the token of the last release (to recognise its retry);
    # a forced release must not let the evicted holder's release pass for a retry.
    with pytest.raises(LeaseLostError) as lost:
        await lease.release()
    assert lost.value.reason is LossReason.NOT_OWNER


async def test_snapshot_parses_a_reservation_and_odd_queue_entries(
    client: redis.asyncio.Redis, tag: str
) -> None:
    """Written by hand, as the scripts would leave it: a release in transit to a queue.
    What is live stays so for a minute: the reads below may take seconds on a loaded
    machine."""
    name = f"{tag}:handover"
    keys = LockKeys.build("aiolock", name)
    seconds, micros = await client.time()
    now_ms = seconds * 1000 + micros // 1000
    await client.hset(keys.lock, mapping={"reserved": "q-next", "fence": "1234"})
    await client.pexpire(keys.lock, 60_000)
    await client.zadd(keys.queue, {"q-next": 1, "q-dead": 2})
    await client.hset(
        keys.waiters,
        mapping={
            "q-next": f"{now_ms + 60_000} 2 web-1 77",
            "q-dead": f"{now_ms - 10} 4 web 2 88",  # expired; a host with a space
            "q-orphan": f"{now_ms + 60_000} 1 web-3 99",  # not in the zset
        },
    )
    await client.lpush(keys.holds, "120", "80", "not a number")
    try:
        (state,) = await read_locks(client, [name])
        assert state.state == "reserved"
        assert state.holder is None and state.age is None
        assert state.reservation is not None
        assert state.reservation.queue_id == "q-next"
        assert 30 < state.reservation.expires_in <= 60
        assert state.last_fencing_token == 1234
        assert [(e.queue_id, e.position) for e in state.queue] == [
            ("q-next", 1),
            ("q-dead", 2),
            ("q-orphan", 3),
        ]
        nxt, dead, orphan = state.queue
        assert (nxt.host, nxt.pid, nxt.count, nxt.expired) == ("web-1", 77, 2, False)
        assert (dead.host, dead.pid, dead.count, dead.expired) == ("web 2", 88, 4, True)
        assert orphan.count == 1 and not orphan.expired
        assert state.waiters == 3  # the expired entry's 4 are not counted
        assert state.holds_ms == (0, 80, 120)
        assert await scan_lock_names(client, pattern=f"{tag}:*") == [name]
        assert (await force_release(client, name)).outcome == "not_held"
    finally:
        await client.delete(keys.lock, keys.queue, keys.waiters, keys.holds)


async def test_scan_and_snapshot_of_semaphores_apart_from_locks(
    client: redis.asyncio.Redis, tag: str
) -> None:
    both, only, gone = f"{tag}:both", f"{tag}:sem-only", f"{tag}:sem-gone"
    lock = await Lock(client, both, ttl=5).acquire()
    permits = [
        await Semaphore(client, both, limit=2, ttl=7).acquire(),
        await Semaphore(client, only, limit=3, ttl=5).acquire(),
    ]
    # Holds recorded, state gone: found only when asked for.
    async with Semaphore(client, gone, limit=2, ttl=5, hold_stats=True):
        pass
    await client.delete(LockKeys.build("aiolock", gone, "sem:").lock)
    try:
        assert await scan_lock_names(client, pattern=f"{tag}:*") == [both]
        assert await scan_lock_names(client, pattern=f"{tag}:*", kind="sem:") == [both, only]
        assert await scan_lock_names(
            client, pattern=f"{tag}:*", kind="semaphore", with_holds=True
        ) == [both, gone, only]
        with pytest.raises(ValueError, match="unknown kind"):
            await scan_lock_names(client, pattern=f"{tag}:*", kind="bogus:")

        (state,) = await read_locks(client, [both], kind="sem:")
        (same,) = await read_locks(client, [both], kind="semaphore")  # by its label
        assert same.holders == tuple(
            dataclasses.replace(info, expires_in=held.expires_in)
            for info, held in zip(state.holders, same.holders, strict=True)
        )
        assert (state.kind, state.state, state.limit, state.free) == ("semaphore", "held", 2, 1)
        assert state.holder is None and state.reservation is None
        (permit,) = state.holders
        assert (permit.slot, permit.fencing_token, permit.ttl) == (0, permits[0].fencing_token, 7)
        assert permit.pid == os.getpid()
        assert state.age is not None and 0 <= state.age < 5
        assert state.hold_stats().ttl == 7.0  # its permits' ttl
        (as_lock,) = await read_locks(client, [both])
        assert (as_lock.kind, as_lock.limit, as_lock.free) == ("lock", None, None)
        assert as_lock.holder is not None and as_lock.holder.fencing_token == lock.fencing_token
        assert as_lock.holders == (as_lock.holder,)
        (recorded,) = await read_locks(client, [gone], kind="sem:")
        assert (recorded.state, recorded.limit, len(recorded.holds_ms)) == ("free", None, 1)
    finally:
        await lock.release()
        for lease in permits:
            await lease.release()


async def test_scan_and_snapshot_of_rwlocks_apart_from_locks_and_semaphores(
    clients: list[redis.asyncio.Redis], tag: str
) -> None:
    """A writer with a writer and a reader waiting (each in a process of its own), and a
    read-write lock held by two readers, beside a lock and a semaphore of the same name."""
    written, read = f"{tag}:written", f"{tag}:read"
    client = clients[0]
    lock = await Lock(client, written, ttl=5).acquire()
    permit = await Semaphore(client, written, limit=2, ttl=5).acquire()
    writer = await ReadWriteLock(client, written, ttl=6).write().acquire()
    readers = [await ReadWriteLock(c, read, ttl=7).read().acquire() for c in clients[:2]]
    waiting = [
        asyncio.create_task(ReadWriteLock(clients[1], written).write().acquire()),
        asyncio.create_task(ReadWriteLock(clients[2], written).read().acquire()),
    ]

    async def queued() -> bool:
        (state,) = await read_locks(client, [written], kind="rw:")
        return (state.writers_waiting, state.readers_waiting) == (1, 1)

    try:
        await eventually(queued, what="a writer and a reader queued")
        assert await scan_lock_names(client, pattern=f"{tag}:*") == [written]
        assert await scan_lock_names(client, pattern=f"{tag}:*", kind="sem:") == [written]
        assert await scan_lock_names(client, pattern=f"{tag}:*", kind="rwlock") == [read, written]

        state, readers_state = await read_locks(client, [written, read], kind="rw:")
        assert (state.kind, state.state, state.limit, state.free) == ("rwlock", "held", None, None)
        assert state.holder is not None and state.holder.fencing_token == writer.fencing_token
        assert (state.holder.ttl, state.holder.slot, state.holder.pid) == (6, None, os.getpid())
        assert state.holders == (state.holder,) and state.readers == ()
        assert [len(state.queue), len(state.reader_queue), state.waiters] == [1, 1, 2]
        assert state.last_fencing_token == writer.fencing_token
        assert state.hold_stats().ttl == 6.0

        assert readers_state.holder is None
        assert [info.fencing_token for info in readers_state.readers] == [
            lease.fencing_token for lease in readers
        ]
        assert readers_state.holders == readers_state.readers
        assert (readers_state.waiters, readers_state.hold_stats().ttl) == (0, 7.0)

        # ReadWriteLock.info() reads the same snapshot.
        info = await ReadWriteLock(client, written).info()
        assert info.writer is not None
        assert info.writer == dataclasses.replace(state.holder, expires_in=info.writer.expires_in)
        assert (info.writers_waiting, info.readers_waiting, info.readers) == (1, 1, ())
        info = await ReadWriteLock(client, read).info()
        assert info.writer is None
        assert [r.fencing_token for r in info.readers] == [r.fencing_token for r in readers]

        (as_lock,) = await read_locks(client, [written])
        assert as_lock.holder is not None and as_lock.holder.fencing_token == lock.fencing_token
        assert as_lock.reader_queue == () and as_lock.waiters == 0
    finally:
        for lease in (lock, permit, writer, *readers):
            await lease.release()
        for task in asyncio.as_completed(waiting):  # the writer, then the reader
            await (await within(task, what="a waiter to get in")).release()
