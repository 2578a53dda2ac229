"""`SimLoop`: an asyncio event loop whose clock is virtual and whose interleavings come from
a seed.

No selector, no I/O, no threads: every callback is a handle in the loop's own queues, and when
nothing is ready, the clock jumps to the next timer. So one seed gives one run, byte for byte,
and minutes of virtual time take a fraction of a second.

What the seed chooses, within what asyncio itself guarantees: callbacks made ready with
`call_soon` run in the order they were registered (asyncio documents it, and code relies on
it: reordering them would find "bugs" no real loop can show). What asyncio leaves to chance is
when things happen: how long each callback takes (here a seeded cost added to the clock after
each one, now and then a longer one: a loaded machine), the order of timers and arrivals that
fall due at the same instant (shuffled), and the delays of the simulated network (the
servers' own RNG, `server`). The choice among the callbacks ready at once is therefore which
of them run before the next timer.

Simulated processes: a handle belongs to the process named by `PROCESS` in its context
(tasks copy their context, so everything a process's tasks schedule is its own). A paused
process's handles are held, not run, until it resumes (a SIGSTOP: time goes on; on resume
the held handles run first, in order, then the timers that fell due meanwhile, as after a
real stall); a killed process's handles are dropped for good (no `finally` runs), and its
tasks, pending for ever, go unreported when collected (a dead process tells nobody).
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import random
import weakref
from asyncio import base_events, events
from collections import deque
from collections.abc import Coroutine
from typing import Any

__all__ = ("PROCESS", "SimLoop", "Stuck")

PROCESS: contextvars.ContextVar[str] = contextvars.ContextVar("aiolock_sim_process", default="")
"""The simulated process a callback belongs to ("" for the simulator itself)."""

START: float = 1_000.0
"""The virtual clock's reading when a loop starts (seconds)."""


class Stuck(RuntimeError):
    """Nothing is ready and no timer is left, yet the loop was asked to go on: every task
    waits for something that never comes."""


class SimLoop(base_events.BaseEventLoop):
    """The seeded, virtual-time loop (see the module docstring)."""

    # asyncio's own queues (`BaseEventLoop`'s, which its stubs do not declare)
    _ready: deque[events.Handle]
    _scheduled: list[events.TimerHandle]
    _timer_cancelled_count: int
    _stopping: bool

    def __init__(self, seed: int, *, cost: float = 20e-6, slow: float = 0.01) -> None:
        """`cost`: the mean time a callback takes (virtual seconds); `slow`: the share of
        callbacks that take a hundred times longer (a loaded machine's hiccup)."""
        super().__init__()
        self.rng = random.Random(seed)
        self._now = START
        self._cost = cost
        self._slow = slow
        self._held: dict[str, list[events.Handle]] = {}
        self._paused: set[str] = set()
        self._killed: set[str] = set()
        self._tasks: dict[str, weakref.WeakSet[asyncio.Task[Any]]] = {}  # by process
        self.steps = 0
        self.trace: list[str] = []
        self.tracing = False
        self._clock_resolution = 1e-9

    # ------------------------------------------------------------------ the clock
    def time(self) -> float:
        return self._now

    # ------------------------------------------------------------------ processes
    def pause(self, process: str) -> None:
        self._paused.add(process)
        self._held.setdefault(process, [])

    def resume(self, process: str) -> None:
        self._paused.discard(process)
        self._ready.extend(self._held.pop(process, []))

    def kill(self, process: str) -> None:
        self._killed.add(process)
        self._paused.discard(process)
        self._held.pop(process, None)
        for task in self._tasks.pop(process, ()):
            task._log_destroy_pending = False  # type: ignore[attr-defined]

    def create_task(  # type: ignore[override]  # (a Task of any result: typed loosely)
        self,
        coro: Coroutine[Any, Any, Any],
        *,
        name: object = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        task = super().create_task(coro, name=name, context=context)
        process = context.get(PROCESS, "") if context is not None else PROCESS.get()
        self._tasks.setdefault(process, weakref.WeakSet()).add(task)
        return task

    def paused(self, process: str) -> bool:
        return process in self._paused

    def killed(self, process: str) -> bool:
        return process in self._killed

    # ------------------------------------------------------------------ what I/O would do
    def _write_to_self(self) -> None:
        """Nothing to wake: there is no selector (threads never call into this loop)."""

    def _process_events(self, event_list: Any) -> None:  # pragma: no cover - no I/O
        raise AssertionError("the simulated loop has no I/O")

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:  # type: ignore[override]
        raise AssertionError("the simulated loop runs no threads")

    # ------------------------------------------------------------------ one iteration
    def _owner(self, handle: events.Handle) -> str:
        context = getattr(handle, "_context", None)
        return context.get(PROCESS, "") if context is not None else ""

    def _due(self) -> None:
        """Move the timers due now to the ready queue (those due at the same instant in a
        seeded order), jumping the clock to the next timer when nothing is ready."""
        while self._scheduled and self._scheduled[0].cancelled():
            self._timer_cancelled_count -= 1
            heapq.heappop(self._scheduled)._scheduled = False  # type: ignore[attr-defined]
        if not self._ready and not self._stopping:
            if not self._scheduled:
                raise Stuck("no callback is ready and no timer is left")
            self._now = max(self._now, self._scheduled[0].when())
        due: list[events.TimerHandle] = []
        while self._scheduled and self._scheduled[0].when() <= self._now:
            handle = heapq.heappop(self._scheduled)
            handle._scheduled = False  # type: ignore[attr-defined]
            if handle.cancelled():
                continue
            if due and due[-1].when() == handle.when() and self.rng.random() < 0.5:
                due.insert(len(due) - 1, handle)
            else:
                due.append(handle)
        self._ready.extend(due)

    def _run_once(self) -> None:
        self._due()
        for _ in range(len(self._ready)):
            handle = self._ready.popleft()
            if handle.cancelled():
                continue
            owner = self._owner(handle)
            if owner in self._killed:
                continue
            if owner in self._paused:
                self._held[owner].append(handle)
                continue
            self.steps += 1
            if self.tracing:
                self.trace.append(f"{self._now:.6f} {owner or '-'} {_name(handle)}")
            handle._run()
            cost = self.rng.expovariate(1 / self._cost) if self._cost else 0.0
            if self._slow and self.rng.random() < self._slow:
                cost *= 100
            self._now += cost


def _name(handle: events.Handle) -> str:
    """A handle's callback, named without addresses (so that traces compare across runs)."""
    callback = getattr(handle, "_callback", None)
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        return f"step {getattr(coro, '__qualname__', type(coro).__name__)}"
    return getattr(callback, "__qualname__", type(callback).__name__)
