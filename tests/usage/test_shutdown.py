"""Shutdown: lock holders are cancelled first, then their locks released, at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import redis.asyncio

from aiolock import ConfigError, Lock, release_all, release_on_signals
from aiolock._aio.shielding import run_shielded
from aiolock._recipes.shutdown import _body_task

from ..support.children import child
from ..support.load import scaled


async def test_bodies_are_cancelled_under_the_lock_then_released(
    client: redis.asyncio.Redis, name: str
) -> None:
    key_during_cancel: list[int] = []
    after_block: list[str] = []
    entered = asyncio.Event()

    async def read_key(lock: Lock) -> None:
        key_during_cancel.append(await client.hexists(lock.key, "token"))

    async def worker(lock: Lock) -> None:
        async with lock:
            entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                # Still protected here: the lock is released only once the body has ended.
                # (A cleanup that must finish runs in a task of its own: release_all cancels
                # a body again if it is still in its block half a second later.)
                await run_shielded(read_key(lock), timeout=10)
                raise
        after_block.append("the code after the block ran as if the work was done")

    guarded = Lock(client, name + ":guarded", ttl=30)
    task = asyncio.create_task(worker(guarded))
    async with asyncio.timeout(10):
        await entered.wait()
    plain = Lock(client, name + ":plain", ttl=30)
    lease = await plain.acquire()  # held outside `async with`: no body to cancel
    async with asyncio.timeout(10):
        report = await release_all(timeout=5)
        with pytest.raises(asyncio.CancelledError):
            await task
    assert report.cancelled == (guarded.name,)
    assert report.released == (plain.name,)
    assert report.still_held == ()
    assert key_during_cancel == [1]
    assert after_block == []
    assert lease.released and not lease.held
    assert not await guarded.locked() and not await plain.locked()


async def test_a_cancellation_lost_on_the_way_is_delivered_again(
    client: redis.asyncio.Redis, name: str
) -> None:
    """redis-py's calls lose a cancellation that lands mid-call now and then on Python 3.11
    (about one in ten): the body goes on as if nothing happened. It is cancelled again."""
    entered = asyncio.Event()
    lock = Lock(client, name, ttl=30)
    calls_after_the_loss: list[int] = []

    async def call_that_loses_a_cancellation() -> None:
        # What such a call does: it returns as if answered.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()

    async def worker() -> None:
        async with lock:
            entered.set()
            await call_that_loses_a_cancellation()
            while True:  # the body's loop goes on: the next call is cancelled again
                calls_after_the_loss.append(1)
                await asyncio.sleep(0.01)

    task = asyncio.create_task(worker())
    async with asyncio.timeout(30):
        await entered.wait()
        report = await release_all(timeout=scaled(10))
        with pytest.raises(asyncio.CancelledError):
            await task
    assert report.cancelled == (name,)
    assert report.still_held == ()
    assert calls_after_the_loss  # the loss happened, and the body went on for a while
    assert not await lock.locked()


async def test_a_body_that_refuses_to_end_keeps_its_lease(
    client: redis.asyncio.Redis, name: str
) -> None:
    entered = asyncio.Event()
    stop = asyncio.Event()
    lock = Lock(client, name, ttl=30)

    async def stubborn() -> None:
        async with lock:
            entered.set()
            while not stop.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await stop.wait()  # swallows every cancellation and goes on working

    task = asyncio.create_task(stubborn())
    async with asyncio.timeout(10):
        await entered.wait()
        report = await release_all(timeout=0.2)
    assert report.still_held == (name,)
    assert report.cancelled == ()
    assert await lock.locked()  # never released under running code
    stop.set()
    async with asyncio.timeout(10):
        await task
    assert not await lock.locked()


async def test_the_callers_own_lease_is_left_to_it(client: redis.asyncio.Redis, name: str) -> None:
    async with Lock(client, name, ttl=30) as lease:
        report = await release_all(timeout=1)
        assert report.still_held == (name,)
        assert lease.held


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError) as info:
        asyncio.run(release_all(timeout=0))
    assert info.value.argument == "timeout"

    async def install(signals: Any) -> None:
        release_on_signals(signals)

    with pytest.raises(TypeError, match=r"signal\.Signals"):
        asyncio.run(install([15]))

    async def drain(seconds: Any) -> None:
        release_on_signals(drain=seconds)

    for bad in (0.5, -1, float("nan")):
        with pytest.raises(ConfigError, match="drain") as info:
            asyncio.run(drain(bad))
        assert info.value.argument == "drain"


def test_the_event_loops_own_handler_is_put_back_and_called() -> None:
    """A handler the event loop ran before (aiohttp's runner installs its SIGTERM so) is
    put back when ours is removed, and a signal then reaches it."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        reached = asyncio.Event()
        loop.add_signal_handler(signal.SIGUSR1, reached.set)
        try:
            remove = release_on_signals([signal.SIGUSR1], terminate=False)
            remove()
            signal.raise_signal(signal.SIGUSR1)
            async with asyncio.timeout(10):
                await reached.wait()  # the loop's own handler, put back
            release_on_signals([signal.SIGUSR1], terminate=True)
            reached.clear()
            signal.raise_signal(signal.SIGUSR1)  # ours: release_all, then raised again
            async with asyncio.timeout(10):
                await reached.wait()  # ... and the loop's handler had it
        finally:
            loop.remove_signal_handler(signal.SIGUSR1)

    asyncio.run(scenario())


def test_removing_the_handlers_puts_back_the_previous_one() -> None:
    def previous(signum: int, frame: object) -> None: ...

    before = signal.signal(signal.SIGUSR1, previous)
    try:

        async def install_and_remove() -> None:
            remove = release_on_signals([signal.SIGUSR1])
            assert signal.getsignal(signal.SIGUSR1) is not previous
            remove()
            remove()  # a second call does nothing

        asyncio.run(install_and_remove())
        assert signal.getsignal(signal.SIGUSR1) is previous
    finally:
        signal.signal(signal.SIGUSR1, before)


def start_holder(
    url: str, name: str, *extra: str
) -> AbstractAsyncContextManager[asyncio.subprocess.Process]:
    """The holder process, for the block (ended with it, however the block ends)."""
    return child("python", "-m", "tests.usage.sigterm_holder", "--url", url, "--name", name, *extra)


async def next_event(process: asyncio.subprocess.Process) -> dict[str, Any]:
    assert process.stdout is not None
    async with asyncio.timeout(30):
        line = await process.stdout.readline()
    assert line, "the holder ended without reporting"
    event: dict[str, Any] = json.loads(line)
    return event


@pytest.mark.real_only
async def test_sigterm_releases_the_lock_at_once_and_ends_the_process(
    server_url: str, client: redis.asyncio.Redis, name: str
) -> None:
    async with start_holder(server_url, name) as holder:
        assert (await next_event(holder))["event"] == "acquired"
        lock = Lock(client, name, ttl=30)
        assert await lock.locked()
        loop = asyncio.get_running_loop()
        signalled = loop.time()
        holder.send_signal(signal.SIGTERM)
        assert await next_event(holder) == {"event": "cancelled", "key_exists": True}
        async with asyncio.timeout(30):
            await holder.wait()
        assert holder.returncode == -signal.SIGTERM  # ended by the signal, as without us
        # Gone long before its 30 s ttl, and taken by the next process at the first try.
        lease = await lock.try_acquire()
        assert lease is not None
        assert loop.time() - signalled < 5
        await lease.release()


@pytest.mark.real_only
async def test_without_terminate_the_process_goes_on(
    server_url: str, client: redis.asyncio.Redis, name: str
) -> None:
    async with start_holder(server_url, name, "--no-terminate") as holder:
        assert (await next_event(holder))["event"] == "acquired"
        holder.send_signal(signal.SIGTERM)
        assert (await next_event(holder))["event"] == "cancelled"
        assert await next_event(holder) == {"event": "exited", "key_exists": False}
        async with asyncio.timeout(30):
            await holder.wait()
        assert holder.returncode == 0


async def test_the_body_task_is_known_for_a_guarded_lease(
    client: redis.asyncio.Redis, name: str
) -> None:
    """release_all finds the task whose body a lease guards (to cancel it before the lease
    is released), and knows a lease that guards none."""
    lock = Lock(client, name, ttl=5)
    lease = await lock.acquire()
    try:
        assert _body_task(lease) is None  # not guarding a block yet
        async with lease:
            assert _body_task(lease) is asyncio.current_task()
    finally:
        if lease.held:
            await lease.release()
