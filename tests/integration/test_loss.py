"""Loss is never silent: the body is cancelled, `async with` raises, and only that is converted."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio

from aiolock import BackendError, LeaseLostError, Lock, LossReason

from ..support.load import scaled


async def test_loss_cancels_the_body_and_raises(client: redis.asyncio.Redis, name: str) -> None:
    lock = Lock(client, name, ttl=scaled(0.3))  # lost by the deletion, not a stall
    reached_end = False
    with pytest.raises(LeaseLostError) as info:
        async with lock as lease:
            await client.delete(lock.key)  # someone evicts the holder
            await asyncio.sleep(10)  # cancelled at the next renewal, within ttl/3
            reached_end = True
    assert not reached_end
    assert info.value.reason is LossReason.NOT_OWNER
    assert info.value.name == name
    assert info.value.fencing_token == lease.fencing_token
    assert lease.lost and lease.loss_reason is LossReason.NOT_OWNER


async def test_loss_cancels_a_task_group_inside_the_body(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=scaled(0.3))  # lost by the deletion, not a stall
    children_cancelled = 0

    async def child() -> None:
        nonlocal children_cancelled
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            children_cancelled += 1
            raise

    with pytest.raises(LeaseLostError):
        async with lock, asyncio.TaskGroup() as group:
            group.create_task(child())
            group.create_task(child())
            await client.delete(lock.key)
    assert children_cancelled == 2


async def test_a_body_that_swallows_the_cancellation_is_cancelled_again(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=scaled(0.3))  # lost by the deletion, not a stall
    swallowed = 0
    with pytest.raises(LeaseLostError):
        async with lock:
            await client.delete(lock.key)
            for _ in range(3):
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    swallowed += 1
    assert swallowed == 3  # every further await of the body is cancelled too


async def test_body_exception_propagates_with_a_note_when_also_lost(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5, renew=False)
    with pytest.raises(KeyError) as info:
        async with lock:
            await client.delete(lock.key)
            raise KeyError("the body's own error")
    notes = getattr(info.value, "__notes__", [])
    assert any("was also lost" in note and name in note for note in notes)


async def test_body_exception_without_loss_has_no_note(
    client: redis.asyncio.Redis, name: str
) -> None:
    with pytest.raises(KeyError) as info:
        async with Lock(client, name, ttl=5):
            raise KeyError("mine")
    assert not getattr(info.value, "__notes__", [])
    assert not await Lock(client, name).locked()


async def test_completing_after_the_key_was_taken_raises(
    client: redis.asyncio.Redis, name: str
) -> None:
    """Without renewal the loss is only discovered at release: still never silent."""
    lock = Lock(client, name, ttl=5, renew=False)
    with pytest.raises(LeaseLostError) as info:
        async with lock:
            await client.delete(lock.key)
            thief = await asyncio.create_task(lock.acquire())  # another task takes it
    assert info.value.reason is LossReason.NOT_OWNER
    assert await lock.locked(), "the stale holder must not delete the new holder's key"
    await thief.release()


async def test_a_blocked_event_loop_past_the_deadline_raises_at_exit(
    client: redis.asyncio.Redis, name: str
) -> None:
    """The deadline timer cannot fire while the loop is blocked; exit checks the clock."""
    lock = Lock(client, name, ttl=0.2)
    await client.ping()  # a connection open: the acquire must be answered within 0.2 s
    with pytest.raises(LeaseLostError) as info:
        async with lock as lease:
            time.sleep(0.3)  # a blocking call in the body: the whole loop stops
    assert info.value.reason is LossReason.DEADLINE
    assert lease.lost


async def test_an_inner_timeout_is_not_mistaken_for_a_loss(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5)
    with pytest.raises(TimeoutError) as info:
        async with lock as lease:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(10)
    assert not isinstance(info.value, LeaseLostError)
    assert lease.released and not lease.lost


async def test_an_outer_timeout_around_the_block_passes_through(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5)
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError) as info:
        async with asyncio.timeout(None) as outer:
            async with lock as lease:
                outer.reschedule(loop.time() + 0.05)  # due in the body, however long it took
                await asyncio.sleep(10)
    assert not isinstance(info.value, LeaseLostError)
    assert lease.released
    assert not await lock.locked()


async def test_wait_lost_outside_async_with(client: redis.asyncio.Redis, name: str) -> None:
    lock = Lock(client, name, ttl=scaled(0.3))  # lost by the deletion, not a stall
    lease = await lock.acquire()
    await client.delete(lock.key)
    error = await asyncio.wait_for(lease.wait_lost(), 5)
    assert isinstance(error, LeaseLostError)
    assert error.reason is LossReason.NOT_OWNER
    with pytest.raises(LeaseLostError):
        await lease.release()


@pytest.mark.real_only
async def test_unreachable_redis_loses_by_deadline_with_the_cause_chained(
    server_url: str, name: str
) -> None:
    """Renewals fail (the backend is gone): the loss comes at the deadline, cause attached."""
    from tests.support.servers import RedisServer, find_binaries

    server = RedisServer(find_binaries()[0]).start()
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        lock = Lock(client, name, ttl=0.4)
        await client.ping()  # a connection open: the acquire must be answered within 0.4 s
        with pytest.raises(LeaseLostError) as info:
            async with lock as lease:
                server.kill()
                await asyncio.sleep(10)
        assert info.value.reason is LossReason.DEADLINE
        assert isinstance(info.value.__cause__, BackendError)
        assert lease.lost
    finally:
        server.stop()
        await client.aclose()
