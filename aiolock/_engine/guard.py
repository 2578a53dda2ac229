"""`BodyGuard`: a lost lease raises in its body at the body's first await after a stall.

A lease's loss cancels the anyio cancel scope of its `async with` block. Two things let
the body take one more step after a stall past its deadline, unless something looks:

- asyncio runs a task's step queued before the stall ahead of the timers that fell due
  during it (the lease's deadline timer among them): the body resumes from a `sleep(0)`
  before its loss is declared;
- anyio's cancel scope does not cancel a task whose awaited future is already done (a
  reply that arrived during the stall): the task resumes normally once.

The guard checks the lease's deadline after each step of the body (a callback queued
behind the body's next step: on the future it awaits, or at once after a ready step), so
a loss is declared before the body's next step runs; and where anyio would skip the
task, it cancels it natively, with anyio's own message for that scope, so that the scope
catches it as its own. It never cancels inside a scope the user shielded (anyio delivers
there once the shield ends), and undoes its own cancellation requests when the block
ends (`Task.uncancel`), so the task's count of pending cancellations is as before.

Code that runs between the stall and the body's next await cannot be stopped: fencing is
what covers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio

__all__ = ("BodyGuard", "new_cancel_scope")

_scope_class: type[anyio.CancelScope] | None = None


def new_cancel_scope() -> anyio.CancelScope:
    """`anyio.CancelScope()`, without looking up the async backend each time: the first
    scope's class (the asyncio backend's) makes the later ones directly."""
    global _scope_class  # noqa: PLW0603 - a cache of one class, set once
    if _scope_class is None:
        scope = anyio.CancelScope()
        _scope_class = type(scope)
        return scope
    return _scope_class()


def _shielded_between(task: asyncio.Task[Any], scope: anyio.CancelScope) -> bool | None:
    """Whether a shielded scope stands between `task`'s innermost anyio scope and `scope`
    (None: `scope` is not among the task's scopes, or anyio's state cannot be read)."""
    try:
        from anyio._backends._asyncio import _task_states  # noqa: PLC0415 - anyio's own state
    except ImportError:  # pragma: no cover - another anyio layout
        return None
    state = _task_states.get(task)
    current = getattr(state, "cancel_scope", None)
    while current is not None:
        if current is scope:
            return False
        if current.shield:
            return True
        current = getattr(current, "_parent_scope", None)
    return None


class BodyGuard:
    """Watches one `async with` block's task for its lease's loss (see the module)."""

    __slots__ = ("_cancels", "_check", "_loop", "_scope", "_soon", "_task", "_waiting_on")

    def __init__(
        self, task: asyncio.Task[Any], scope: anyio.CancelScope, check: Callable[[], None]
    ) -> None:
        """`check` declares the loss if the lease's deadline has passed (it is then
        told with `lost()`)."""
        self._task: asyncio.Task[Any] | None = task
        self._scope = scope
        self._check = check
        self._loop = task.get_loop()
        self._cancels = 0
        self._waiting_on: asyncio.Future[Any] | None = None
        self._soon = self._loop.call_soon(self._after_step)

    def _after_step(self, _future: object = None) -> None:
        """The body has taken a step (or the future it awaits is done)."""
        self._waiting_on = None
        task = self._task
        if task is None or task.done():
            return
        self._check()
        if self._task is None:
            return
        waiter = getattr(task, "_fut_waiter", None)
        if isinstance(waiter, asyncio.Future):
            waiter.add_done_callback(self._after_step)  # runs after the task's own wake-up
            self._waiting_on = waiter
        else:  # the task's next step is queued: look again right after it
            self._soon = self._loop.call_soon(self._after_step)

    def lost(self) -> None:
        """The lease was lost: cancel the block's scope, and the task natively where anyio
        leaves it to resume normally (the future it awaits is done)."""
        task = self._task
        if task is None:
            return
        self._scope.cancel()
        if task.done() or task is asyncio.current_task(self._loop):
            return
        waiter = getattr(task, "_fut_waiter", None)
        if not isinstance(waiter, asyncio.Future) or not waiter.done():
            return  # anyio's own cancellation reaches it
        if (
            getattr(task, "_must_cancel", False)
            or _shielded_between(task, self._scope) is not False
        ):
            return
        reason = getattr(self._scope, "_cancel_reason", None)
        task.cancel(reason or f"Cancelled via cancel scope {id(self._scope):x}")
        self._cancels += 1

    def close(self) -> None:
        """The block ends (call before its scope's exit): stop watching, and take back the
        cancellation requests made here."""
        task, self._task = self._task, None
        self._soon.cancel()  # (a look still queued: the loop skips it, and a write need not wait)
        if self._waiting_on is not None:
            self._waiting_on.remove_done_callback(self._after_step)
            self._waiting_on = None
        while task is not None and self._cancels:
            task.uncancel()
            self._cancels -= 1
