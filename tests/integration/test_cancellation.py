"""Cancellation: of a waiting or running acquire, of the release, of the body, of wait_lost.

The contract (README, "Cancellation contract"): a cancelled acquire leaves no lock held and
no waiter queued; the release finishes even if the task is cancelled again meanwhile; an
outer cancellation of the body propagates untouched, after the release.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from aiolock import Lease, Lock
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys

from ..support.waits import eventually, within


def channel_of(name: str) -> str:
    return LockKeys.build("aiolock", name).channel


async def parked(client: redis.asyncio.Redis, name: str, count: int) -> None:
    """Wait until `count` tasks of this process are queued for the lock `name`, each of
    them asleep in its waiter (not in the middle of a Redis command)."""
    notifier = runtime_for(client).notifier

    def all_parked() -> bool:
        queue = notifier._queues.get(channel_of(name))
        return (
            queue is not None
            and len(queue.waiters) == count
            and all(w._future is not None and not w._future.done() for w in queue.waiters)
        )

    await eventually(all_parked, what=f"{count} task(s) queued and asleep in their waiters")


async def test_cancelled_waiter_leaves_the_queue_and_holds_nothing(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=30)
    holder = await lock.acquire()
    waiting = asyncio.create_task(Lock(client, name, ttl=30).acquire())
    await parked(client, name, 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert runtime_for(client).notifier.queue_length(channel_of(name)) == 0
    info = await lock.info()
    assert info is not None and info.fencing_token == holder.fencing_token
    await holder.release()
    assert not await lock.locked()
    successor = await Lock(client, name, ttl=30).try_acquire()
    assert successor is not None, "the cancelled waiter must not hold or block the lock"
    assert successor.fencing_token > holder.fencing_token
    await successor.release()


async def test_cancelling_the_head_waiter_hands_its_turn_to_the_next(
    client: redis.asyncio.Redis, name: str
) -> None:
    """The next waiter must not miss the release meant for the cancelled one: it is
    woken by the local release, not left to poll the holder's (30 s) ttl."""
    holder = await Lock(client, name, ttl=30).acquire()
    head = asyncio.create_task(Lock(client, name, ttl=30).acquire())
    await parked(client, name, 1)
    second = asyncio.create_task(Lock(client, name, ttl=30).acquire())
    await parked(client, name, 2)
    head.cancel()
    with pytest.raises(asyncio.CancelledError):
        await head
    assert runtime_for(client).notifier.queue_length(channel_of(name)) == 1
    assert not second.done()
    await holder.release()
    lease = await asyncio.wait_for(second, 10)  # a hang guard: expected within milliseconds
    assert lease.fencing_token > holder.fencing_token
    await lease.release()
    assert runtime_for(client).notifier.queue_length(channel_of(name)) == 0


async def test_acquire_cancelled_at_every_await_point_leaves_no_lock(
    client: redis.asyncio.Redis, name: str
) -> None:
    """A free lock, an acquire cancelled after k loop iterations, k = 0..29: either the
    lease was granted (and is released here) or the lock is free afterwards."""
    lock = Lock(client, name, ttl=30)
    outcomes: list[str] = []
    for k in range(30):
        task = asyncio.create_task(Lock(client, name, ttl=30).acquire())
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        try:
            lease = await task
        except asyncio.CancelledError:
            outcomes.append("cancelled")
            assert not await lock.locked(), f"cancelled after {k} iterations, key left held"
        else:
            outcomes.append("granted")
            assert lease.held
            await lease.release()
            assert not await lock.locked()
        assert runtime_for(client).notifier.queue_length(channel_of(name)) == 0
    assert outcomes[0] == "cancelled"  # k = 0: cancelled before it ever ran
    # No connection was left with an unread reply: every reply matches its own command.
    for i in range(20):
        await client.set(f"{name}:probe:{i}", f"value-{i}", ex=60)
    for i in range(20):
        assert await client.get(f"{name}:probe:{i}") == f"value-{i}".encode()
    assert await client.ping()
    after = await lock.acquire(timeout=5)
    await after.release()


async def test_a_cancel_requested_while_acquire_is_pending_is_never_lost(
    client: redis.asyncio.Redis, name: str
) -> None:
    """If `task.cancel()` returns True (the acquire had not finished), the task must end in
    CancelledError: turning the cancellation into a granted lease defeats `asyncio.timeout`,
    `TaskGroup` and every caller that cancels."""
    lock = Lock(client, name, ttl=30)
    lost_cancellations: list[int] = []
    for k in range(30):
        task = asyncio.create_task(Lock(client, name, ttl=30).acquire())
        for _ in range(k):
            await asyncio.sleep(0)
        requested = task.cancel()
        try:
            lease = await task
        except asyncio.CancelledError:
            assert not await lock.locked()
        else:
            await lease.release()
            if requested:
                lost_cancellations.append(k)
    assert not lost_cancellations, (
        f"acquire() returned a lease although cancelled while pending, after k = "
        f"{lost_cancellations} loop iterations"
    )


@pytest.mark.real_only
async def test_release_completes_through_two_native_cancellations(
    client: redis.asyncio.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered = asyncio.Event()
    proceed = asyncio.Event()
    original = Lock._release_lease

    async def held_up_release(self: Lock, lease: Lease, *, timeout: float) -> bool:
        entered.set()
        await proceed.wait()
        return await original(self, lease, timeout=timeout)

    monkeypatch.setattr(Lock, "_release_lease", held_up_release)
    lock = Lock(client, name, ttl=5)
    leases: list[Lease] = []

    async def holder() -> None:
        async with lock as lease:
            leases.append(lease)  # the body ends normally: __aexit__ releases

    task = asyncio.create_task(holder())
    await within(entered.wait(), what="the release to start")
    assert await lock.locked()
    for _ in range(2):
        task.cancel()
        for _ in range(5):  # let the cancellation be delivered inside the release
            await asyncio.sleep(0)
        assert not task.done(), "the release must not be abandoned on cancellation"
    assert task.cancelling() == 2
    assert await lock.locked(), "the release is still held up"
    proceed.set()
    with pytest.raises(asyncio.CancelledError):
        await within(task, what="the held-up release to finish")
    assert not await lock.locked()
    [lease] = leases
    assert lease.released and not lease.lost


async def test_outer_cancellation_of_the_body_propagates_untouched(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5)
    entered = asyncio.Event()
    leases: list[Lease] = []

    async def holder() -> None:
        async with lock as lease:
            leases.append(lease)
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(holder())
    await within(entered.wait(), what="the body to start")
    assert await lock.locked()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(task, what="the cancelled block to exit")  # not LeaseLostError
    [lease] = leases
    assert lease.released and not lease.lost and lease.loss_reason is None
    assert not await lock.locked()


async def test_cancelling_wait_lost_is_harmless(client: redis.asyncio.Redis, name: str) -> None:
    lock = Lock(client, name, ttl=5)
    lease = await lock.acquire()
    watcher = asyncio.create_task(lease.wait_lost())
    await asyncio.sleep(0)  # let it start waiting
    watcher.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watcher
    assert lease.held and not lease.lost
    assert await lock.locked()
    await lease.extend()
    second = asyncio.create_task(lease.wait_lost())
    await asyncio.sleep(0)
    assert not second.done()
    await lease.release()
    assert await within(second, what="wait_lost() to return after the release") is None
    assert lease.released
    assert not await lock.locked()
