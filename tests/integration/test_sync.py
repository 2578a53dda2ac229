"""aiolock.sync: the synchronous face, on a real server.

The same keys, scripts and fencing tokens as asyncio code's; leases renewed by the one
background loop; a loss told by `lost`, `check()`, `on_lost` and the block's exit; threads
sharing one lock object; calls refused from a thread that runs an event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

import aiolock
import aiolock.sync
from aiolock import AcquireTimeoutError, ConfigError, LeaseLostError, LossReason

from ..checker import Section, verify
from ..support.load import scaled
from ..support.waits import BOUND, eventually

pytestmark = pytest.mark.real_only


@pytest.fixture
def sync_client(server_url: str) -> Iterator[redis.Redis]:
    """A synchronous client; aiolock.sync is shut down after the test (its thread, its
    connections)."""
    client = redis.Redis.from_url(server_url)
    try:
        yield client
    finally:
        aiolock.sync.shutdown()
        client.close()


def run_threads(count: int, target: object, *args: object) -> None:
    """Run `target(i, *args)` in `count` threads; every one joined, bounded."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i, *args)  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND * 6)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish"
    if errors:
        raise errors[0]


# --------------------------------------------------------------------------- the basics
def test_a_with_block_holds_a_lease_and_releases_it(sync_client: redis.Redis, name: str) -> None:
    lock = aiolock.sync.Lock(sync_client, name, ttl=10)
    with lock as lease:
        assert isinstance(lease, aiolock.sync.Lease)
        assert lease.held and not lease.lost and lease.name == name
        assert sync_client.exists(lock.key)
        assert lock.try_acquire() is None  # busy
        lease.check()
        lease.extend()
        assert 9 < lease.remaining() <= 10
    assert lease.released and lease.remaining() == 0.0
    assert not sync_client.hexists(lock.key, "token")
    with pytest.raises(RuntimeError, match="released"):
        lease.check()
    lease.release()  # again: nothing


def test_acquire_try_acquire_and_release(sync_client: redis.Redis, name: str) -> None:
    lock = aiolock.sync.Lock(sync_client, name, ttl=10)
    lease = lock.acquire()
    try:
        with pytest.raises(AcquireTimeoutError):
            lock.acquire(timeout=0.1)
        busy = lock.try_acquire_or_busy()
        assert isinstance(busy, aiolock.Busy) and busy.holder is not None
        info = lock.info()
        assert info is not None and info.fencing_token == lease.fencing_token
        assert lock.locked()
    finally:
        lease.release()
    assert not lock.locked()
    again = lock.try_acquire()
    assert again is not None and again.fencing_token > lease.fencing_token
    again.release()


async def test_a_sync_holder_and_an_async_holder_of_one_name_exclude_each_other(
    sync_client: redis.Redis, server_url: str, name: str
) -> None:
    """The same keys and scripts: each side finds the other's lease; one fencing sequence.
    (From async code, the sync calls go through a thread, as they must.)"""
    aclient = redis.asyncio.Redis.from_url(server_url)
    try:
        sync_lock = aiolock.sync.Lock(sync_client, name, ttl=10)
        async_lock = aiolock.Lock(aclient, name, ttl=10)
        sync_lease = await asyncio.to_thread(sync_lock.acquire)
        assert await async_lock.try_acquire() is None
        await asyncio.to_thread(sync_lease.release)
        async with async_lock as async_lease:
            assert async_lease.fencing_token > sync_lease.fencing_token
            assert await asyncio.to_thread(sync_lock.try_acquire) is None
        async with async_lock:  # held first, then the sync side waits for it
            waiting = asyncio.create_task(asyncio.to_thread(sync_lock.acquire, timeout=BOUND))

            async def queued() -> bool:
                info = await async_lock.info()
                return info is not None and info.waiting == 1

            await eventually(queued, what="the sync acquire queued")
            assert not waiting.done()
        later = await asyncio.wait_for(waiting, BOUND)
        assert later.fencing_token > async_lease.fencing_token
        await asyncio.to_thread(later.release)
    finally:
        await aclient.aclose()


async def test_a_sync_call_from_a_thread_running_an_event_loop_raises(
    sync_client: redis.Redis, name: str
) -> None:
    lock = aiolock.sync.Lock(sync_client, name)
    with pytest.raises(RuntimeError, match="runs an asyncio event loop"):
        lock.acquire()
    with pytest.raises(RuntimeError, match="runs an asyncio event loop"), lock:
        pytest.fail("must not run")
    with pytest.raises(TypeError, match=r"aiolock\.Lock"):
        async with lock:
            pytest.fail("must not run")


def test_a_thread_waiting_for_a_name_it_holds_is_refused(
    sync_client: redis.Redis, name: str
) -> None:
    lock = aiolock.sync.Lock(sync_client, name, ttl=10)
    other = aiolock.sync.Lock(sync_client, name, ttl=10)
    with lock:
        with pytest.raises(RuntimeError, match="already held by this thread"):
            other.acquire()
        assert other.try_acquire() is None  # a single try is allowed, and finds it busy


# --------------------------------------------------------------------------- threads
def test_32_threads_on_4_names_never_overlap_and_tokens_increase(
    sync_client: redis.Redis, name: str
) -> None:
    names = [f"{name}:{i}" for i in range(4)]
    locks = [aiolock.sync.Lock(sync_client, n, ttl=10, timeout=BOUND * 3) for n in names]
    sections: list[Section] = []
    rounds = 12

    def work(i: int) -> None:
        lock = locks[i % 4]  # one object shared by 8 threads
        for _ in range(rounds):
            with lock as lease:
                enter = time.monotonic()
                lease.check()
                time.sleep(0.001)
                sections.append(
                    Section(lease.name, lease.fencing_token, enter, time.monotonic(), False, str(i))
                )

    run_threads(32, work)
    verdict = verify(sorted(sections, key=lambda s: (s.enter, s.exit)))
    assert verdict.sections == 32 * rounds
    assert verdict.violations == []
    assert all(not sync_client.hexists(lock.key, "token") for lock in locks)


def test_threads_sharing_one_lock_object_release_their_own_leases(
    sync_client: redis.Redis, name: str
) -> None:
    """A semaphore of 2 shared by two threads: each `with` is its own permit, and each
    thread's exit releases its own, whatever order they leave in."""
    semaphore = aiolock.sync.Semaphore(sync_client, name, limit=2, ttl=10)
    both_in = threading.Barrier(2, timeout=BOUND)
    first_out = threading.Event()
    tokens: dict[int, int] = {}

    def hold(i: int) -> None:
        with semaphore as permit:
            tokens[i] = permit.fencing_token
            both_in.wait()
            if i == 1:
                first_out.wait(BOUND)  # thread 1 leaves after thread 0
            assert permit.held
        if i == 0:
            first_out.set()

    run_threads(2, hold)
    assert len(set(tokens.values())) == 2
    assert semaphore.info().holders == ()


def test_a_semaphore_lease_of_several_permits(sync_client: redis.Redis, name: str) -> None:
    """As asyncio's `Semaphore.acquire(permits=n)`: taken all at once or not at all, one
    lease, and a count out of range refused at the call."""
    semaphore = aiolock.sync.Semaphore(sync_client, name, limit=3, ttl=10)
    lease = semaphore.acquire(permits=2)
    try:
        assert lease.permits == 2
        assert semaphore.try_acquire(permits=2) is None
        one = semaphore.try_acquire()
        assert one is not None and one.permits == 1
        one.release()
        assert semaphore.info().held == 2
    finally:
        lease.release()
    with pytest.raises(ConfigError, match="permits"):
        semaphore.acquire(permits=0)
    assert semaphore.info().held == 0


def test_read_write_lock_sides(sync_client: redis.Redis, name: str) -> None:
    rw = aiolock.sync.ReadWriteLock(sync_client, name, ttl=10)
    with rw.read() as first:
        second = rw.read().try_acquire()  # readers share (a single try: this thread reads)
        assert second is not None and first.fencing_token != second.fencing_token
        assert rw.write().try_acquire() is None
        second.release()
        with pytest.raises(RuntimeError, match="already held by this thread"):
            rw.write().acquire()  # either side, as for a task
    with rw.write() as writer:
        assert rw.read().try_acquire() is None
        assert writer.fencing_token > second.fencing_token
    assert not rw.locked()


# --------------------------------------------------------------------------- renewal and loss
def test_a_lease_is_renewed_past_its_ttl(sync_client: redis.Redis, name: str) -> None:
    ttl = scaled(0.6)
    with aiolock.sync.Lock(sync_client, name, ttl=ttl) as lease:
        end = time.monotonic() + 3 * ttl
        while time.monotonic() < end:  # a busy pure-Python body
            lease.check()
        assert lease.held
        assert sync_client.hget(f"aiolock:{{{name}}}", "token") == lease.token.encode()


def busy_until_lost(lease: aiolock.sync.Lease, limit: float) -> tuple[float, LeaseLostError]:
    """Spin in pure Python, calling `check()`, until it raises: when, and what."""
    end = time.monotonic() + limit
    spins = 0
    while time.monotonic() < end:
        try:
            lease.check()
        except LeaseLostError as error:
            return time.monotonic(), error
        spins += 1
    raise AssertionError(f"no loss within {limit:g}s ({spins} checks)")


def test_a_refused_renewal_is_seen_by_a_busy_body_within_a_third_of_the_ttl(
    sync_client: redis.Redis, name: str
) -> None:
    ttl = scaled(1.5)
    told: list[LeaseLostError] = []
    callback_threads: list[str] = []

    def on_lost(error: LeaseLostError) -> None:
        told.append(error)
        callback_threads.append(threading.current_thread().name)

    lock = aiolock.sync.Lock(sync_client, name, ttl=ttl, on_lost=on_lost)
    with pytest.raises(LeaseLostError) as at_exit, lock as lease:
        sync_client.delete(lock.key)  # someone evicts the holder
        deleted = time.monotonic()
        seen, error = busy_until_lost(lease, ttl)
        assert error.reason is LossReason.NOT_OWNER
        assert seen - deleted <= ttl / 3 + scaled(0.15), seen - deleted
        assert lease.lost and not lease.held
        # the body goes on (it cannot be cancelled): its exit says so
    assert at_exit.value.body_completed is True
    assert at_exit.value.fencing_token == lease.fencing_token
    assert [e.reason for e in told] == [LossReason.NOT_OWNER]
    assert callback_threads == ["aiolock-sync"]


def test_the_body_s_own_check_error_passes_the_exit_unchanged(
    sync_client: redis.Redis, name: str
) -> None:
    lock = aiolock.sync.Lock(sync_client, name, ttl=scaled(0.6))
    with pytest.raises(LeaseLostError) as info, lock as lease:
        sync_client.delete(lock.key)
        busy_until_lost(lease, BOUND)
        lease.check()
    assert info.value.body_completed is None
    assert not getattr(info.value, "__notes__", None)


def test_a_body_exception_gets_a_note_when_the_lease_was_also_lost(
    sync_client: redis.Redis, name: str
) -> None:
    lock = aiolock.sync.Lock(sync_client, name, ttl=scaled(0.6))
    with pytest.raises(ValueError, match="the body's own") as info, lock as lease:
        sync_client.delete(lock.key)
        busy_until_lost(lease, BOUND)
        raise ValueError("the body's own")
    assert any("also lost" in note for note in info.value.__notes__)


def test_an_on_lost_callback_that_calls_aiolock_sync_is_refused(
    sync_client: redis.Redis, name: str
) -> None:
    refused: list[BaseException] = []
    told = threading.Event()

    def on_lost(error: LeaseLostError) -> None:
        try:
            aiolock.sync.Lock(sync_client, name + ":other").try_acquire()
        except RuntimeError as exc:
            refused.append(exc)
        told.set()

    lock = aiolock.sync.Lock(sync_client, name, ttl=scaled(0.6), on_lost=on_lost)
    with pytest.raises(LeaseLostError), lock:
        sync_client.delete(lock.key)
        assert told.wait(BOUND)
    assert "own event loop thread" in str(refused[0])


# --------------------------------------------------------------------------- recipes
def test_run_once_runs_a_job_once_across_sync_and_async_callers(
    sync_client: redis.Redis, server_url: str, name: str
) -> None:
    ran: list[int] = []

    def job(lease: aiolock.sync.Lease) -> int:
        lease.check()
        ran.append(lease.fencing_token)
        return 42

    first = aiolock.sync.run_once(sync_client, name, job, retention=60)
    second = aiolock.sync.run_once(sync_client, name, job, retention=60)
    assert first.status is aiolock.OnceStatus.RAN and first.value == 42
    assert second.status is aiolock.OnceStatus.ALREADY_DONE
    assert len(ran) == 1

    async def async_job() -> None:
        ran.append(0)

    async def from_async() -> aiolock.OnceStatus:
        client = redis.asyncio.Redis.from_url(server_url)
        try:
            return (await aiolock.run_once(client, name, async_job, retention=60)).status
        finally:
            await client.aclose()

    assert asyncio.run(from_async()) is aiolock.OnceStatus.ALREADY_DONE
    assert len(ran) == 1


def test_run_once_refuses_an_async_job(sync_client: redis.Redis, name: str) -> None:
    async def job() -> None:
        pass

    with pytest.raises(TypeError, match=r"aiolock\.run_once"):
        aiolock.sync.run_once(sync_client, name, job, retention=60)


def test_locked_runs_a_function_under_a_lock_named_from_its_arguments(
    sync_client: redis.Redis, name: str
) -> None:
    inside = threading.Event()
    leave = threading.Event()

    @aiolock.sync.locked(sync_client, name + ":{order_id}", timeout=0, on_busy="skip")
    def fulfil(lease: aiolock.sync.Lease, order_id: int) -> int:
        inside.set()
        leave.wait(BOUND)
        return lease.fencing_token

    results: list[int | None] = []
    holder = threading.Thread(target=lambda: results.append(fulfil(1)))
    holder.start()
    try:
        assert inside.wait(BOUND)
        assert fulfil(1) is None  # busy: skipped
        assert sync_client.exists(f"aiolock:{{{name}:1}}")
    finally:
        leave.set()
        holder.join(BOUND)
    assert isinstance(results[0], int)
    with pytest.raises(TypeError, match=r"aiolock\.locked"):

        @aiolock.sync.locked(sync_client, name, timeout=0, on_busy="raise")
        async def not_sync() -> None:
            pass


# --------------------------------------------------------------------------- shutdown
def test_release_all_gives_back_held_leases_and_tells_the_bodies(
    sync_client: redis.Redis, name: str
) -> None:
    lock = aiolock.sync.Lock(sync_client, name, ttl=30)
    with pytest.raises(LeaseLostError, match="release_all") as info, lock as lease:
        report = aiolock.sync.release_all()
        assert report.released == (name,)
        assert not sync_client.hexists(lock.key, "token")
        assert lease.lost
        with pytest.raises(LeaseLostError, match="release_all"):
            lease.check()
    assert info.value.body_completed is True


def test_release_all_stops_a_waiting_acquisition(sync_client: redis.Redis, name: str) -> None:
    lock = aiolock.sync.Lock(sync_client, name, ttl=30)
    held = lock.acquire()
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            lock.acquire(timeout=BOUND * 3)
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        deadline = time.monotonic() + BOUND
        while (info := lock.info()) is None or info.waiting == 0:
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.01)
        report = aiolock.sync.release_all()
    finally:
        waiter.join(BOUND)
    assert report.cancelled == (name,) and report.released == (name,)
    assert isinstance(outcome[0], RuntimeError) and "release_all" in str(outcome[0])
    assert not sync_client.hexists(lock.key, "token")
    assert held.lost
