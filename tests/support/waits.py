"""Bounded waits for the tests: a wait that does not end fails with what it waited for.

- `eventually(check, what=...)`: until `check()` (sync or async) holds;
- `within(awaitable, what=...)`: the awaitable's result (a task, an event's wait...);
- `until_cancelled(what=...)`: the body of a block that only a cancellation may end (a
  lease's loss); if none comes, it fails;
- `cancelled(*tasks)`: tasks a test started, cancelled and awaited (its cleanup);
- `closed(loop)`: an event loop a test made itself (not running) closed, every task still
  on it cancelled and ended first (a lock client's watchdog outlives its last lease).

The bounds are generous (the suite must pass on a loaded 2-core machine); they only turn
a hang into a failure with a message, before pytest-timeout would.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

BOUND = 10.0
"""Default bound of a wait, in seconds."""


class WaitTimeout(AssertionError):
    """A bounded wait ran out."""


async def eventually(
    check: Callable[[], bool | Awaitable[bool]],
    *,
    what: str,
    timeout: float = BOUND,
    interval: float = 0.0,
) -> None:
    """Wait until `check()` holds, checking every `interval` seconds (0: at every turn of
    the event loop); fail after `timeout` seconds, naming `what`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() >= deadline:
            raise WaitTimeout(f"still not true after {timeout:g}s: {what}")
        await asyncio.sleep(interval)


async def within(awaitable: Awaitable[T], *, what: str, timeout: float = BOUND) -> T:
    """`await awaitable`, failing after `timeout` seconds (a task awaited is then cancelled,
    as by `asyncio.wait_for`). A `TimeoutError` of the awaitable's own propagates as is."""
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            return await awaitable
    except TimeoutError:
        if scope.expired():
            raise WaitTimeout(f"not done after {timeout:g}s: {what}") from None
        raise


async def until_cancelled(*, what: str, timeout: float = BOUND) -> NoReturn:
    """Wait for a cancellation (`what`), and fail if none comes within `timeout` seconds."""
    await asyncio.sleep(timeout)
    raise WaitTimeout(f"no cancellation after {timeout:g}s: {what}")


async def handler_entered(
    entered: asyncio.Event, request: asyncio.Future[Any], *, timeout: float = BOUND
) -> None:
    """Wait until a request's handler sets `entered`; fail at once, with the answer, if the
    request (a task) ends before that (the handler never ran: say, its lock was lost first)."""
    waiter = asyncio.ensure_future(entered.wait())
    try:
        done, _ = await asyncio.wait(
            {waiter, request}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiter.cancel()
    if entered.is_set():
        return
    if request in done:
        raise WaitTimeout(f"the request ended before its handler ran: {request.result()!r}")
    raise WaitTimeout(f"the handler did not run within {timeout:g}s")


async def cancelled(*tasks: asyncio.Future[Any] | None) -> None:
    """Each task (None: not started) cancelled and awaited, whatever it ended with."""
    for task in tasks:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def closed(loop: asyncio.AbstractEventLoop) -> None:
    """End every task of `loop` (made by the test, not running), then close it."""
    try:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    finally:
        loop.close()
