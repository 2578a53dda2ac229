"""The one place that shields cleanup from cancellation.

`asyncio.shield` alone re-raises at the first cancel and leaves the work orphaned, and
`anyio.CancelScope(shield=True)` only blocks anyio-scope cancels: a native `Task.cancel()`
(from `asyncio.timeout`, a `TaskGroup`, or a server dropping the request) still pierces it.
`run_shielded` instead runs the cleanup as a task of its own and keeps waiting for it through
any number of cancels, bounded by a timeout, then re-raises the cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ("run_shielded",)

T = TypeVar("T")


async def run_shielded(coro: Coroutine[Any, Any, T], *, timeout: float) -> T:
    """Run `coro` to completion even if the calling task is cancelled meanwhile.

    Returns what `coro` returns, or raises what it raises. If `coro` has not finished after
    `timeout` seconds it is cancelled, awaited, and `TimeoutError` is raised.

    Cancellation:
        Cancelling the caller does not stop `coro`: the caller keeps waiting (up to
        `timeout`), then raises `asyncio.CancelledError` once `coro` is done, so the
        cancellation is delayed but never lost. The cancel request stays counted by
        `Task.cancelling()`, so `asyncio.timeout` and `TaskGroup` above see it.
    """
    loop = asyncio.get_running_loop()
    task = loop.create_task(coro)
    deadline = loop.time() + timeout
    cancelled = False
    timed_out = False
    while not task.done():
        remaining = deadline - loop.time()
        if remaining <= 0 and not timed_out:
            timed_out = True
            task.cancel()
        try:
            await asyncio.wait({task}, timeout=None if timed_out else remaining)
        except asyncio.CancelledError:
            cancelled = True
    if task.cancelled():
        if cancelled:
            raise asyncio.CancelledError
        raise TimeoutError(f"cleanup did not finish within {timeout:g}s")
    error = task.exception()
    if cancelled:
        raise asyncio.CancelledError
    if error is not None:
        raise error
    return task.result()
