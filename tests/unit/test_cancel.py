"""run_shielded: cleanup that finishes through cancellation, bounded by a timeout.

Steps are sequenced with events, never with sleeps. Where a test needs the caller to have
handled a cancellation before it goes on, it relies on asyncio running ready callbacks in
FIFO order: `task.cancel()` schedules the caller's wake-up at once, so anything the test
waits for that is scheduled after it runs after the caller has handled the cancel.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from aiolock._aio.shielding import run_shielded

from ..support.waits import within


async def test_returns_the_value() -> None:
    async def cleanup() -> str:
        await asyncio.sleep(0)
        return "done"

    assert await run_shielded(cleanup(), timeout=5) == "done"


async def test_propagates_the_exception() -> None:
    error = KeyError("boom")

    async def cleanup() -> None:
        await asyncio.sleep(0)
        raise error

    with pytest.raises(KeyError) as info:
        await run_shielded(cleanup(), timeout=5)
    assert info.value is error


async def test_cleanup_completes_through_two_native_cancels() -> None:
    events: list[str] = []
    started = asyncio.Event()
    step = asyncio.Event()
    stepped = asyncio.Event()
    finish = asyncio.Event()
    cancelling_seen: list[int] = []

    async def cleanup() -> str:
        events.append("cleanup started")
        started.set()
        await step.wait()
        stepped.set()
        await finish.wait()
        events.append("cleanup finished")
        return "done"

    async def caller() -> str:
        try:
            return await run_shielded(cleanup(), timeout=30)
        except asyncio.CancelledError:
            events.append("caller cancelled")
            task = asyncio.current_task()
            assert task is not None
            cancelling_seen.append(task.cancelling())
            raise

    task = asyncio.create_task(caller())
    await started.wait()

    task.cancel()  # 1: the caller's wake-up is scheduled now ...
    step.set()  # ... the cleanup's after it
    await stepped.wait()  # so the caller has handled cancel 1 by the time this returns
    assert not task.done()
    assert events == ["cleanup started"]

    task.cancel()  # 2, while the cleanup still runs
    finish.set()

    with pytest.raises(asyncio.CancelledError):
        await within(task, what="the shielded cleanup's caller to end")
    assert task.cancelled()
    assert events == ["cleanup started", "cleanup finished", "caller cancelled"]
    assert cancelling_seen == [2]  # both requests still counted


async def test_cancel_wins_over_the_cleanup_error() -> None:
    started = asyncio.Event()
    finish = asyncio.Event()

    async def cleanup() -> None:
        started.set()
        await finish.wait()
        raise KeyError("boom")

    task = asyncio.create_task(run_shielded(cleanup(), timeout=30))
    await started.wait()
    task.cancel()
    finish.set()
    with pytest.raises(asyncio.CancelledError):
        await within(task, what="the shielded cleanup's caller to end")
    assert task.cancelled()


async def test_timeout_cancels_a_cleanup_that_never_finishes() -> None:
    never = asyncio.Event()
    events: list[str] = []

    async def cleanup() -> None:
        try:
            await never.wait()
        except asyncio.CancelledError:
            events.append("cleanup cancelled")
            raise

    with pytest.raises(TimeoutError, match=r"did not finish within 0\.05s"):
        await run_shielded(cleanup(), timeout=0.05)
    assert events == ["cleanup cancelled"]


async def test_outer_asyncio_timeout_still_fires_after_the_cleanup() -> None:
    loop = asyncio.get_running_loop()
    events: list[str] = []
    started = asyncio.Event()
    finish = asyncio.Event()
    scopes: list[asyncio.Timeout] = []

    async def cleanup() -> str:
        events.append("cleanup started")
        started.set()
        await finish.wait()
        events.append("cleanup finished")
        return "done"

    async def caller() -> None:
        # Already expired: it cancels the task at its first suspension, inside run_shielded.
        async with asyncio.timeout_at(loop.time()) as scope:
            scopes.append(scope)
            await run_shielded(cleanup(), timeout=30)
        events.append("after the timeout block")  # pragma: no cover - must not run

    task = asyncio.create_task(caller())
    await started.wait()
    (scope,) = scopes
    assert scope.expired()  # the timeout has fired ...
    assert not task.done()  # ... and the caller still waits for the cleanup
    assert events == ["cleanup started"]

    finish.set()
    with pytest.raises(TimeoutError) as info:
        await within(task, what="the shielded cleanup's caller to end")
    assert not task.cancelled()
    # Raised by asyncio.timeout's exit (3.11.2 raises it without a cause, later ones from
    # the cancellation), not by run_shielded's own timeout.
    assert str(info.traceback[-1].path).endswith("timeouts.py")
    assert events == ["cleanup started", "cleanup finished"]


async def test_native_cancel_pierces_an_anyio_shield_on_asyncio() -> None:
    """Why run_shielded exists: `anyio.CancelScope(shield=True)` does not stop Task.cancel()."""
    events: list[str] = []
    started = asyncio.Event()
    never = asyncio.Event()

    async def shielded_cleanup() -> None:
        with anyio.CancelScope(shield=True):
            started.set()
            try:
                await never.wait()
            except asyncio.CancelledError:
                events.append("pierced")
                raise
            events.append("completed")  # pragma: no cover - the point is it never gets here

    task = asyncio.create_task(shielded_cleanup())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(task, what="the shielded cleanup's caller to end")
    assert task.cancelled()
    assert events == ["pierced"]
