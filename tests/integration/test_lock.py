"""Acquire, release, extend, inspect: the basic contract against a real server and fakeredis."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
from typing import Any

import pytest
import redis.asyncio

from aiolock import (
    AcquireTimeoutError,
    BackendError,
    Lease,
    LeaseLostError,
    Lock,
    LockInfo,
    LossReason,
)
from aiolock._lua.layout import LockKeys
from aiolock._model.holder import text

from ..support.load import scaled
from ..support.waits import within


async def test_async_with_acquires_and_releases(client: redis.asyncio.Redis, name: str) -> None:
    lock = Lock(client, name, ttl=5)
    assert not await lock.locked()
    async with lock as lease:
        assert isinstance(lease, Lease)
        assert await lock.locked()
        assert (lease.held, lease.lost, lease.released) == (True, False, False)
        assert 4.5 < lease.remaining() <= 5
    assert lease.released and not lease.held
    assert lease.remaining() == 0.0
    assert not await lock.locked()


async def test_second_holder_waits_for_release(client: redis.asyncio.Redis, name: str) -> None:
    first = await Lock(client, name, ttl=5).acquire()
    assert await Lock(client, name, ttl=5).try_acquire() is None
    waiter = asyncio.create_task(Lock(client, name, ttl=5).acquire(timeout=5))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await first.release()
    second = await within(waiter, what="the waiter to get the lock")
    assert second.fencing_token > first.fencing_token
    await second.release()


async def test_timeout_raises_acquire_timeout(client: redis.asyncio.Redis, name: str) -> None:
    held = await Lock(client, name, ttl=5).acquire()
    with pytest.raises(AcquireTimeoutError) as info:
        await Lock(client, name, ttl=5).acquire(timeout=0.2)
    assert info.value.name == name
    assert info.value.attempts >= 2
    assert info.value.timeout == 0.2, "the timeout passed, not the time spent"
    # Up to float rounding: `waited` is the difference of two readings of the loop's clock
    # (uvloop: 0.1999999999998181 once).
    assert 0.2 - 1e-9 <= info.value.waited < 1.0
    assert isinstance(info.value, TimeoutError)
    with pytest.raises(AcquireTimeoutError) as info:
        await Lock(client, name, ttl=5, timeout=0).acquire()
    assert info.value.attempts == 1
    assert info.value.timeout == 0
    await held.release()


def test_errors_can_be_built_by_user_code() -> None:
    """Code standing in for a busy lock or a loss (a test double) needs only the name."""
    busy = AcquireTimeoutError(name="orders:42", timeout=1.5)
    assert busy.name == "orders:42" and busy.timeout == 1.5 and busy.waited == 1.5
    assert "orders:42" in str(busy) and "1.5s" in str(busy)
    assert busy.holder is None and busy.retry_after is None
    lost = LeaseLostError(name="orders:42", reason=LossReason.DEADLINE, fencing_token=7)
    assert "deadline" in str(lost) and lost.fencing_token == 7
    assert LeaseLostError(name="x").reason is LossReason.NOT_OWNER
    broken = BackendError("Redis is down", operation="acquire")
    assert broken.name is None


async def test_lock_timeout_applies_to_async_with(client: redis.asyncio.Redis, name: str) -> None:
    held = await Lock(client, name).acquire()
    with pytest.raises(AcquireTimeoutError):
        async with Lock(client, name, timeout=0.1):
            pytest.fail("must not run")
    await held.release()


async def test_fencing_tokens_strictly_increase(client: redis.asyncio.Redis, name: str) -> None:
    tokens = []
    for _ in range(20):
        async with Lock(client, name, ttl=5) as lease:
            tokens.append(lease.fencing_token)
    assert tokens == sorted(set(tokens))


async def test_tokens_are_128_bit_secrets_never_shown_whole(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5)
    leases = [await Lock(client, f"{name}:{i}").acquire() for i in range(5)]
    for lease in leases:
        assert len(lease.token) == 32 and int(lease.token, 16) >= 0
        assert lease.token not in repr(lease)
        await lease.release()
        assert lease.token not in repr(lease)
    assert len({lease.token for lease in leases}) == 5
    assert lock.name in repr(lock)


async def test_shared_lock_object_gives_each_task_its_own_lease(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5)
    inside = 0
    most_inside = 0
    leases: list[Lease] = []

    async def worker() -> None:
        nonlocal inside, most_inside
        async with lock as lease:
            inside += 1
            most_inside = max(most_inside, inside)
            leases.append(lease)
            await asyncio.sleep(0.01)
            inside -= 1

    await within(asyncio.gather(*(worker() for _ in range(8))), what="eight workers in turn")
    assert most_inside == 1
    assert len({lease.token for lease in leases}) == 8


async def test_one_task_cannot_release_another_tasks_lease(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5)
    entered = asyncio.Event()
    leave = asyncio.Event()

    async def holder() -> None:
        async with lock:
            entered.set()
            await leave.wait()

    task = asyncio.create_task(holder())
    await within(entered.wait(), what="the holder's body to start")
    with pytest.raises(RuntimeError, match="not held by the current task"):
        await lock.__aexit__(None, None, None)
    assert await lock.locked()
    leave.set()
    await within(task, what="the holder's block to exit")
    assert not await lock.locked()


async def test_release_is_idempotent_and_extend_after_release_is_an_error(
    client: redis.asyncio.Redis, name: str
) -> None:
    lease = await Lock(client, name).acquire()
    await lease.release()
    await lease.release()
    with pytest.raises(RuntimeError, match="released"):
        await lease.extend()


async def test_extend_resets_the_expiry(client: redis.asyncio.Redis, name: str) -> None:
    ttl = scaled(0.5)  # still held after the sleep, on a loaded machine
    lease = await Lock(client, name, ttl=ttl, renew=False).acquire()
    await asyncio.sleep(ttl * 0.6)
    before = lease.remaining()
    await lease.extend()
    assert lease.remaining() > before + ttl * 0.4
    info = await Lock(client, name).info()
    assert info is not None and info.expires_in > before
    await lease.release()


async def test_release_and_extend_of_a_stolen_lease_raise_lease_lost(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5, renew=False)
    lease = await lock.acquire()
    await client.delete(lock.key)
    with pytest.raises(LeaseLostError) as info:
        await lease.extend()
    assert info.value.reason is LossReason.NOT_OWNER
    assert info.value.fencing_token == lease.fencing_token
    assert lease.lost
    with pytest.raises(LeaseLostError):
        await lease.release()

    other = await lock.acquire()
    await client.delete(lock.key)
    thief = await lock.acquire()
    with pytest.raises(LeaseLostError):
        await other.release()
    assert await lock.locked(), "a stale release must not delete the new holder's key"
    await thief.release()


def _holder_pid_seen_by_a_forked_child(url: str, name: str, out: Any) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(url)
        try:
            async with Lock(client, name, ttl=5):
                info = await Lock(client, name).info()
                out.put((os.getpid(), None if info is None else info.pid))
        finally:
            await client.aclose()

    asyncio.run(main())


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_a_forked_worker_is_recorded_under_its_own_pid(server_url: str, name: str) -> None:
    """A worker forked after aiolock was imported (gunicorn --preload, a prefork pool)
    records its own process id, not its parent's."""
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_holder_pid_seen_by_a_forked_child, args=(server_url, name, out))
    child.start()
    try:
        child_pid, recorded = out.get(timeout=30)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()
    assert child_pid != os.getpid()
    assert recorded == child_pid


async def test_info_describes_the_holder(client: redis.asyncio.Redis, name: str) -> None:
    lock = Lock(client, name, ttl=7)
    assert await lock.info() is None
    async with lock as lease:
        info = await lock.info()
        assert isinstance(info, LockInfo)
        assert info.fencing_token == lease.fencing_token
        assert info.pid == os.getpid()
        assert info.task == asyncio.current_task().get_name()  # type: ignore[union-attr]
        assert info.ttl == 7
        assert 6 < info.expires_in <= 7
        assert info.acquired_at > 1.7e9
        assert lease.token not in repr(info)


async def test_the_layout_holds_exact_numbers(client: redis.asyncio.Redis, name: str) -> None:
    """Fencing tokens (µs-sized) and times are written with all their digits."""
    keys = LockKeys.build("aiolock", name)
    async with Lock(client, name, ttl=7) as lease:
        seconds, micros = await client.time()
        now_us = seconds * 1_000_000 + micros
        assert 0 <= now_us - lease.fencing_token < 5_000_000  # floored by the server clock
        fields = await client.hgetall(keys.lock)
        assert fields[b"fence"] == str(lease.fencing_token).encode()
        assert fields[b"token"] == lease.token.encode()
        assert fields[b"k"] == lease.token[:16].encode()
        host, pid, task = text(fields[b"m"]).split(" ", 2)
        assert host and int(pid) == os.getpid()
        assert task == asyncio.current_task().get_name()  # type: ignore[union-attr]
        assert fields[b"a"].isdigit()
        assert 0 <= now_us // 1000 - int(fields[b"a"]) < 5_000
        assert fields[b"t"] == b"7000"
    # What stays: the last fencing token and the token's first 64 bits, nothing of the holder.
    assert await client.hgetall(keys.lock) == {
        b"fence": str(lease.fencing_token).encode(),
        b"k": lease.token[:16].encode(),
    }


async def test_renewal_keeps_the_lease_past_its_ttl(client: redis.asyncio.Redis, name: str) -> None:
    ttl = scaled(0.3)  # renewed on time on a loaded machine
    lock = Lock(client, name, ttl=ttl)
    async with lock as lease:
        await asyncio.sleep(ttl * 10 / 3)
        assert lease.held
        assert await lock.locked()
    assert not await lock.locked()


async def test_without_renewal_the_lease_is_lost_at_its_deadline(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=0.2, renew=False)
    await client.ping()  # a connection open: the acquire must be answered within 0.2 s
    lease = await lock.acquire()
    error = await asyncio.wait_for(lease.wait_lost(), 2)
    assert isinstance(error, LeaseLostError)
    assert error.reason is LossReason.DEADLINE
    assert lease.lost and lease.remaining() == 0.0
    with pytest.raises(LeaseLostError):
        await lease.release()


async def test_wait_lost_returns_none_after_release(client: redis.asyncio.Redis, name: str) -> None:
    lease = await Lock(client, name).acquire()
    watcher = asyncio.create_task(lease.wait_lost())
    await lease.release()
    assert await within(watcher, what="wait_lost() to return after the release") is None


async def test_max_hold_stops_renewal(client: redis.asyncio.Redis, name: str) -> None:
    ttl = scaled(0.2)  # renewed on time even on a loaded machine, until max_hold
    lock = Lock(client, name, ttl=ttl, max_hold=2 * ttl)
    with pytest.raises(LeaseLostError) as info:
        async with lock:
            await asyncio.sleep(25 * ttl)
    assert info.value.reason is LossReason.MAX_HOLD


async def test_decode_responses_client_works(
    backend_kind: str, request: pytest.FixtureRequest, name: str
) -> None:
    if backend_kind == "real":
        client = redis.asyncio.Redis.from_url(
            request.getfixturevalue("server_url"), decode_responses=True
        )
    else:
        import fakeredis

        client = fakeredis.FakeAsyncRedis(decode_responses=True)
    try:
        ttl = scaled(0.3)  # renewed in time on a loaded machine
        lock = Lock(client, name, ttl=ttl)
        async with lock as lease:
            await asyncio.sleep(ttl * 1.7)  # held past its ttl: renewals on this client work
            info = await lock.info()
            assert info is not None and info.fencing_token == lease.fencing_token
        again = await lock.try_acquire()
        assert again is not None
        await again.release()
    finally:
        await client.aclose()


async def test_the_state_stays_until_the_released_lease_would_have_expired(
    client: redis.asyncio.Redis, name: str
) -> None:
    """A ttl between the retention (10 s) and an hour: the release sets no expiry, the
    state stays as long as the lease's key would have."""
    keys = LockKeys.build("aiolock", name)
    lease = await Lock(client, name, ttl=20).acquire()
    await lease.release()
    assert 15_000 < await client.pttl(keys.lock) <= 20_000
    again = await Lock(client, name, ttl=20).acquire()
    assert again.fencing_token > lease.fencing_token
    await again.release()


@pytest.mark.parametrize(
    ("ttl", "retain", "expected_s"),
    [(1, None, 10.0), (2, 5, 5.0), (7200, None, 10.0), (7200, 60, 60.0)],
    ids=["short-ttl", "retain=5", "long-ttl", "long-ttl-retain=60"],
)
async def test_the_retention_is_set_when_the_ttl_would_not_serve(
    client: redis.asyncio.Redis, name: str, ttl: float, retain: float | None, expected_s: float
) -> None:
    keys = LockKeys.build("aiolock", name)
    lock = (
        Lock(client, name, ttl=ttl)
        if retain is None
        else Lock(client, name, ttl=ttl, retain=retain)
    )
    lease = await lock.acquire()
    await lease.release()
    assert expected_s * 1000 - 2000 < await client.pttl(keys.lock) <= expected_s * 1000
    assert set(await client.hkeys(keys.lock)) == {b"fence", b"k"}


async def test_hold_durations_are_the_holders_own(client: redis.asyncio.Redis, name: str) -> None:
    """Measured by the holder, from the grant to the release, in ms (with hold_stats)."""
    keys = LockKeys.build("aiolock", name)
    loop = asyncio.get_running_loop()
    async with Lock(client, name, ttl=5):
        pass
    assert not await client.exists(keys.holds), "recorded only when asked for"
    async with Lock(client, name, ttl=5, hold_stats=True) as lease:
        entered = loop.time()
        await asyncio.sleep(0.05)  # uvloop's timers may wake a fraction of a ms early
        body = loop.time() - entered
        held = lease.held_for()
    (recorded,) = await client.lrange(keys.holds, 0, -1)
    assert round(body * 1000) <= int(recorded) <= held * 1000 + 50
