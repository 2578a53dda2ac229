"""Per redis client and event loop: the background work aiolock runs for every lock.

A `Runtime` holds the client's `Backend` (the I/O seam; for a Redlock's `Quorum` of
clients, the backend its kind makes: `_transport.backend.open_backend`), its `RenewalScheduler` (one task
renewing every lease) and its `Notifier` (one pub/sub subscription for every waiter), each
made on first use; which tasks of this process hold which lock in an `async with` block
(to refuse a wait that would never end); and the short tasks it starts on the side (a
granted lease's first renewal). Found with `runtime_for(client)`.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Coroutine
from typing import Any

from .._aio.eager_start import start_eagerly
from .._transport.backend import detached, open_backend
from .._transport.clients import AsyncClient
from .._transport.quorum import Quorum
from .notifier import Notifier
from .watchdog import RenewalScheduler

__all__ = ("Runtime", "runtime_for")


class Runtime:
    """aiolock's own state and background work for one client in one event loop."""

    __slots__ = ("__weakref__", "_notifier", "_scheduler", "_spawned", "backend", "guards", "loop")

    def __init__(self, client: AsyncClient | Quorum) -> None:
        self.backend = open_backend(client)
        self.loop = self.backend.loop
        self._scheduler: RenewalScheduler | None = None
        self._notifier: Notifier | None = None
        # Key of a held lock -> the tasks whose `async with` block a lease of it guards.
        self.guards: dict[str, list[asyncio.Task[Any]]] = {}
        self._spawned: set[asyncio.Task[None]] = set()

    @property
    def scheduler(self) -> RenewalScheduler:
        if self._scheduler is None:
            self._scheduler = RenewalScheduler(self.backend)
        return self._scheduler

    @property
    def notifier(self) -> Notifier:
        if self._notifier is None:
            self._notifier = Notifier(self.backend)
        return self._notifier

    def guarded_by(self, key: str, task: asyncio.Task[Any] | None) -> bool:
        """Whether `task` holds the lock at `key` in an `async with` block."""
        tasks = self.guards.get(key)
        return tasks is not None and task in tasks

    def guard(self, key: str, task: asyncio.Task[Any], *, entered: bool) -> None:
        """`task` entered (or left) an `async with` block holding the lock at `key`."""
        if entered:
            self.guards.setdefault(key, []).append(task)
            return
        tasks = self.guards.get(key, [])
        if task in tasks:
            tasks.remove(task)
        if not tasks:
            self.guards.pop(key, None)

    def spawn(
        self, call: Coroutine[Any, Any, None], *, eager: bool = False
    ) -> asyncio.Future[None]:
        """Run `call` in a task of its own, kept until it ends (it must bound itself); the
        task, for a caller that waits for it. Its calls may outlive their caller (`detached`):
        a call sent again goes on a connection of its own, never in a pool the user may
        have closed meanwhile.

        `eager`: `call` runs at once, up to its first suspension, before this returns (a
        command it writes is written by then; see `_aio.eager_start`); else it starts at the loop's
        next turn, as any task."""
        if eager:
            task = start_eagerly(self.loop, call, context=detached())
            if task.done():
                return task
        else:
            task = self.loop.create_task(call, context=detached())
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)
        return task


_runtimes: weakref.WeakKeyDictionary[AsyncClient | Quorum, Runtime] = weakref.WeakKeyDictionary()


_last: tuple[weakref.ref[Any], weakref.ref[Runtime]] | None = None
"""The client and the runtime `runtime_for` found last (weakly): an acquisition asks for the
same one several times."""


def runtime_for(client: AsyncClient | Quorum) -> Runtime:
    """The runtime of `client` (or of a Redlock's quorum of clients) in the running event
    loop, created on first use."""
    global _last  # noqa: PLW0603 - a cache of one entry
    loop = asyncio.get_running_loop()
    last = _last
    if last is not None and last[0]() is client:
        runtime = last[1]()
        if runtime is not None and runtime.loop is loop:
            return runtime
    runtime = _runtimes.get(client)
    if runtime is None or runtime.loop is not loop:
        runtime = _runtimes[client] = Runtime(client)
    _last = (weakref.ref(client), weakref.ref(runtime))
    return runtime
