"""Starting a task eagerly: its coroutine runs at once, up to its first suspension, before
the caller goes on; what it writes to a socket by then is written.

Python 3.12 has this as `asyncio.eager_task_factory`, used as it is. On Python 3.11 the same
is done here: a task is made for the coroutine, the coroutine is run by hand as that task
(it is the current task, in the task's own context) up to its first suspension, and the task
goes on from there at the loop's next turn (a coroutine that ended in that first step ends
its task there).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from typing import Any, Final, TypeVar

__all__ = ("start_eagerly", "start_task")

T = TypeVar("T")

_FACTORY: Final[Any] = getattr(asyncio, "eager_task_factory", None)
"""asyncio's eager task start (Python 3.12 on), or None."""


def start_eagerly(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, T],
    *,
    context: contextvars.Context | None = None,
) -> asyncio.Task[T]:
    """A task running `coro` (in `context`, else a copy of the current one), which has run
    up to its first suspension when this returns.

    Cancellation:
        Cancelling the task before its first step at the loop throws `CancelledError` into
        `coro` where it is suspended, as for any task.
    """
    if _FACTORY is not None:
        task: asyncio.Task[T] = _FACTORY(loop, coro, context=context)
        return task
    return _start_by_hand(loop, coro, context)  # pragma: no cover - Python 3.11


def start_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task running `coro` in a copy of the current context: started eagerly where asyncio
    does it (Python 3.12 on), else at the loop's next turn, for a caller to whom an early
    start is worth only what it costs (on 3.11, starting by hand costs more than the turn of
    the loop it saves).

    Cancellation:
        As `start_eagerly`'s, or as any task's.
    """
    if _FACTORY is not None:
        task: asyncio.Task[T] = _FACTORY(loop, coro)
        return task
    return loop.create_task(coro)  # pragma: no cover - Python 3.11


class _Started(Coroutine[Any, Any, T]):
    """`coro` after its first step was run by hand: that step's outcome is what the task
    sees at its own first step; every later one goes to `coro` itself."""

    __slots__ = ("_coro", "_first", "_outcome")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro = coro
        self._first = True
        # What the first step did: ("yield", value), ("return", None) or ("raise", error).
        self._outcome: tuple[str, Any] = ("yield", None)

    def send(self, value: Any) -> Any:
        if self._first:
            self._first = False
            kind, what = self._outcome
            self._outcome = ("yield", None)  # drop the references
            if kind == "raise":
                raise what
            if kind == "return":
                raise StopIteration(what)
            return what
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if self._first:
            self._first = False
            kind, _ = self._outcome
            self._outcome = ("yield", None)
            if kind != "yield":  # `coro` already ended: nothing to throw into
                raise typ if val is None else val
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - asyncio throws instances

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, T]:  # pragma: no cover - run by a task
        raise TypeError("a started coroutine is run by its task, never awaited")


def _start_by_hand(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, T],
    context: contextvars.Context | None,
) -> asyncio.Task[T]:  # pragma: no cover - Python 3.11
    if context is None:
        context = contextvars.copy_context()
    started = _Started(coro)
    task = loop.create_task(started, context=context)
    caller = asyncio.current_task(loop)
    # The first step runs as `task`, as asyncio would run it: current_task() is `task`.
    if caller is not None:
        asyncio.tasks._leave_task(loop, caller)
    asyncio.tasks._enter_task(loop, task)
    try:
        started._outcome = ("yield", context.run(coro.send, None))
    except StopIteration as stop:
        started._outcome = ("return", stop.value)
    except BaseException as exc:  # noqa: BLE001 - given to the task, raised at its first step
        started._outcome = ("raise", exc)
    finally:
        asyncio.tasks._leave_task(loop, task)
        if caller is not None:
            asyncio.tasks._enter_task(loop, caller)
    return task
