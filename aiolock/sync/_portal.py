"""The one background event loop of `aiolock.sync`, in a thread of its own, per process.

Every synchronous lock of the process runs on it: its acquisitions and releases, and the
watchdog that renews its leases (the engine's, one per client, as in asyncio code). A sync
call hands a coroutine to the loop (`Portal.run`) and waits for its outcome on a lock of its
own, which a signal (Ctrl-C) interrupts: the call is then stopped on the loop and what it
had got is given back before the interruption propagates.

- Started on first use, stopped by `stop()` (at interpreter exit too, `atexit`), started
  again by the next use.
- After `os.fork()` the child has no such thread: the portal of the parent is forgotten
  (never used, never closed, its sockets untouched), the generation counter moves on (every
  lease made before the fork reports itself lost in the child) and the child starts a
  portal of its own on first use.
- A call made from a thread that runs an event loop (an async view, a notebook, the
  portal's own thread: an `on_lost` callback) raises `RuntimeError` instead of blocking that
  loop; so does a call under gevent's or eventlet's monkey-patching, whose green threads
  cannot wait for a real one.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, Final, Generic, TypeVar

__all__ = (
    "GIVE_BACK_BOUND",
    "Portal",
    "check_caller",
    "generation",
    "on_loop_thread",
    "portal",
    "stop",
)

logger = logging.getLogger("aiolock")

T = TypeVar("T")

GIVE_BACK_BOUND: Final = 10.0
"""Longest wait, after an interruption, for an acquisition stopped midway to be given back
(its own bounds are shorter: an abort takes 1 s at most, a release 5 s)."""
STOP_BOUND: Final = 10.0
"""Longest wait for the loop's thread to finish its last work when stopped."""


def _run_job(job: tuple[concurrent.futures.Future[Any], Callable[..., Any], Any, Any]) -> None:
    future, fn, args, kwargs = job
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
        future.set_exception(exc)


class _Resolver(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor (host names are resolved there when a connection
    opens): one daemon thread of its own, which goes on working at interpreter exit, when
    `concurrent.futures`' executors already refuse work (the last releases may have to
    connect again); where no thread can be started any more, the work runs inline. (A
    `ThreadPoolExecutor`, as asyncio requires of a default executor, that uses none of its
    threads.)"""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._starting = threading.Lock()

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        job = (future, fn, args, kwargs)
        if self._started():
            self._jobs.put(job)
        else:
            _run_job(job)
        return future

    def _started(self) -> bool:
        with self._starting:
            if self._worker is None:
                worker = threading.Thread(
                    target=self._work, name="aiolock-sync-resolver", daemon=True
                )
                try:
                    worker.start()
                except RuntimeError:  # the interpreter is shutting down
                    return False
                self._worker = worker
        return True

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            _run_job(job)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        worker = self._worker
        if worker is not None:
            self._jobs.put(None)
            if wait:
                worker.join(STOP_BOUND)


def _new_loop() -> asyncio.AbstractEventLoop:
    """asyncio's own loop, whatever the policy says: its clock is `time.monotonic()`, the
    clock a sync lease's deadline is read on from other threads."""
    if sys.platform == "win32":  # pragma: no cover - not tested on Windows
        return asyncio.ProactorEventLoop()
    return asyncio.SelectorEventLoop()


class _Call(Generic[T]):
    """One coroutine run on the loop for a waiting thread, and its give-back if that thread
    is interrupted (or `release_all` stops it)."""

    __slots__ = (
        "_done",
        "_error",
        "_external",
        "_given_back",
        "_interrupted",
        "_loop",
        "_make",
        "_registry",
        "_result",
        "_settled",
        "_stop",
        "_task",
        "_undo",
        "label",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        make: Callable[[], Coroutine[Any, Any, T]],
        *,
        undo: Callable[[T], Coroutine[Any, Any, object]] | None,
        stop: bool,
        registry: set[_Call[Any]],
        label: str,
    ) -> None:
        self.label = label
        self._loop = loop
        self._make = make
        self._undo = undo
        self._stop = stop
        self._registry = registry
        self._done = threading.Lock()
        self._done.acquire()
        self._given_back = threading.Lock()
        self._given_back.acquire()
        self._interrupted = False
        self._external: BaseException | None = None  # the error release_all ends it with
        self._settled: asyncio.Future[None] | None = None
        self._task: asyncio.Task[T] | None = None
        self._result: T | None = None
        self._error: BaseException | None = None

    # ----------------------------------------------------------------- on the loop
    def start(self) -> None:
        try:
            self._task = self._loop.create_task(self._make())
        except BaseException as exc:  # noqa: BLE001 - told to the waiting thread
            self._error = exc
            self._done.release()
            self._given_back.release()
            return
        if self._undo is not None:
            self._registry.add(self)
        self._task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[T]) -> None:
        if task.cancelled():
            self._error = RuntimeError(
                "aiolock.sync was stopped while this call ran (shutdown() or interpreter exit)"
            )
        elif (error := task.exception()) is not None:
            self._error = error
        else:
            self._result = task.result()
        if self._interrupted:
            self._give_back()
        else:
            self._registry.discard(self)
            self._done.release()

    def interrupt(self) -> None:
        """The waiting thread gave up (interrupted): stop the coroutine, or give back what
        it got if it had finished."""
        if self._interrupted:
            return
        self._interrupted = True
        task = self._task
        if task is None:
            self._gave()
        elif not task.done():
            if self._stop:
                task.cancel()  # the coroutine gives back what it had half made
            # (else: left to finish, as a release is; its outcome ends the wait)
        else:
            self._give_back()

    def abandon(self, error: BaseException) -> asyncio.Future[None]:
        """Stop the call (for `release_all`) as an interruption would; once what it had
        got is given back, its waiting thread gets `error`. Done when given back."""
        self._settled = self._loop.create_future()
        if not self._interrupted:
            self._external = error
            self.interrupt()
        return self._settled

    def _give_back(self) -> None:
        undo, result = self._undo, self._result
        self._result = None
        if undo is None or result is None:
            self._gave()
            return
        giving = self._loop.create_task(undo(result))
        giving.add_done_callback(self._gave_back)

    def _gave_back(self, giving: asyncio.Task[object]) -> None:
        if not giving.cancelled() and (error := giving.exception()) is not None:
            logger.warning("aiolock: giving back an interrupted acquisition failed: %s", error)
        self._gave()

    def _gave(self) -> None:
        self._registry.discard(self)
        self._given_back.release()
        if self._external is not None:
            self._error = self._external
            self._done.release()
        if self._settled is not None and not self._settled.done():
            self._settled.set_result(None)

    # ----------------------------------------------------------------- in the waiting thread
    def wait(self) -> T:
        try:
            self._done.acquire()
            error = self._error
            if error is None:
                return self._result  # type: ignore[return-value]  # set when no error
        except BaseException:
            # Interrupted (Ctrl-C, a signal handler that raised, as Celery's time limits do),
            # also right after the answer came: stop the call on the loop, and let what it
            # made be given back first.
            with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
                self._loop.call_soon_threadsafe(self.interrupt)
                self._wait_given_back()
            raise
        self._error = None
        raise error

    def _wait_given_back(self) -> None:
        deadline = time.monotonic() + GIVE_BACK_BOUND
        while True:
            try:
                left = deadline - time.monotonic()
                if left <= 0 or self._given_back.acquire(timeout=left):
                    return
            except BaseException:  # noqa: BLE001, S112 - a second interruption: keep giving back (bounded)
                continue


class Portal:
    """The loop thread and how sync code runs coroutines on it."""

    __slots__ = ("_acquiring", "_executor", "_stopping", "loop", "thread", "thread_id")

    def __init__(self) -> None:
        self.loop = _new_loop()
        self._executor = _Resolver()
        self.loop.set_default_executor(self._executor)
        self._stopping = False
        self._acquiring: set[_Call[Any]] = set()  # on the loop: the calls with a give-back
        started = threading.Event()
        self.thread = threading.Thread(
            target=self._serve, args=(started,), name="aiolock-sync", daemon=True
        )
        self.thread.start()
        started.wait()
        self.thread_id = self.thread.ident

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        self.loop.run_forever()

    def run(
        self,
        make: Callable[[], Coroutine[Any, Any, T]],
        *,
        undo: Callable[[T], Coroutine[Any, Any, object]] | None = None,
        stop: bool = True,
        label: str = "",
    ) -> T:
        """Run `make()` on the loop and return its result (or raise its error) in the
        calling thread. Interrupted meanwhile (a signal's exception in the main thread), the
        coroutine is cancelled (`stop`; else left to finish) and a result it had already
        returned is given back with `undo(result)`; the interruption is raised once that is
        done (within `GIVE_BACK_BOUND`). `label` names it for `stop_acquisitions`."""
        call = _Call(self.loop, make, undo=undo, stop=stop, registry=self._acquiring, label=label)
        self.loop.call_soon_threadsafe(call.start)
        return call.wait()

    def stop_acquisitions(self) -> list[tuple[str, asyncio.Future[None]]]:
        """On the loop: stop every call with a give-back in progress (the acquisitions);
        their threads get `RuntimeError`. Each future is done once its call gave back."""
        error = RuntimeError(
            "aiolock.sync.release_all() stopped this acquisition (the process is stopping); "
            "nothing is held"
        )
        return [(call.label, call.abandon(error)) for call in list(self._acquiring)]

    def close(self, *, at_exit: bool) -> None:
        """Stop the loop once `finish()` has run on it, join its thread, close it."""
        if self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(Exception):
            self.run(_finish, stop=False)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(STOP_BOUND)
        if self.thread.is_alive():  # pragma: no cover - a task that ignores cancellation
            logger.warning("aiolock: aiolock.sync's event loop did not stop in time")
            return
        self.loop.close()
        self._executor.shutdown(wait=not at_exit)


async def _finish() -> None:
    """On the loop: cancel what still runs (the watchdogs and listeners close their
    connections on the way out), and wait for it, bounded."""
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks(loop) if task is not me]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=STOP_BOUND / 2)
    await loop.shutdown_asyncgens()


# --------------------------------------------------------------------------- process state
class _State:
    portal: Portal | None = None
    generation = 0
    """Moves on in a forked child: what was made before belongs to the parent."""
    lock = threading.Lock()
    at_exit_registered = False
    stop_hooks: ClassVar[list[Callable[[bool], None]]] = []
    """Called (with `at_exit`) before the loop stops: release what is held, close clients."""
    forgotten: ClassVar[list[object]] = []
    """What a forked child inherited and must neither use nor close (the parent's)."""


def generation() -> int:
    """The process's generation: a lease of an earlier one was made before a fork."""
    return _State.generation


def portal() -> Portal:
    """The running portal, started if need be."""
    current = _State.portal
    if current is not None:
        return current
    with _State.lock:
        if _State.portal is None:
            _State.portal = Portal()
            if not _State.at_exit_registered:
                atexit.register(_at_exit)
                _State.at_exit_registered = True
        return _State.portal


def running_portal() -> Portal | None:
    """The portal if it runs (None: nothing was started, or it was stopped)."""
    return _State.portal


def on_stop(hook: Callable[[bool], None]) -> None:
    """Call `hook(at_exit)` each time the portal is about to stop, while its loop still runs."""
    _State.stop_hooks.append(hook)


def stop(*, at_exit: bool = False) -> None:
    """Stop the portal: the stop hooks run (releases, clients closed), then the loop."""
    with _State.lock:
        current = _State.portal
        if current is None:
            return
        try:
            for hook in _State.stop_hooks:
                try:
                    hook(at_exit)
                except Exception:
                    logger.exception("aiolock: stopping aiolock.sync failed")
            current.close(at_exit=at_exit)
        finally:
            _State.portal = None


def _at_exit() -> None:
    stop(at_exit=True)


def _forked_child() -> None:
    """In a forked child: the parent's portal (its thread does not exist here) is
    forgotten, and the generation moves on."""
    if _State.portal is not None:
        _State.forgotten.append(_State.portal)
        _State.portal = None
    _State.generation += 1
    _State.lock = threading.Lock()


os.register_at_fork(after_in_child=_forked_child)


def on_fork(hook: Callable[[], None]) -> None:
    """Call `hook()` in a forked child (after the portal was forgotten)."""
    os.register_at_fork(after_in_child=hook)


def forget(what: object) -> None:
    """Keep `what` (the parent's, in a forked child) alive for good: never collected, so
    never closed (its sockets are the parent's)."""
    _State.forgotten.append(what)


def on_loop_thread() -> bool:
    """Whether the caller runs on the portal's own thread (an `on_lost` callback)."""
    current = _State.portal
    return current is not None and threading.get_ident() == current.thread_id


def _green() -> str | None:
    """ "gevent" or "eventlet" if its monkey-patching replaced the threads, else None."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return "gevent"
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        return "eventlet"
    return None


def check_caller(what: str) -> None:
    """`RuntimeError` if the calling thread must not wait for the portal (see the module's
    docstring); `what` names the call for the message."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        if on_loop_thread():
            raise RuntimeError(
                f"{what} was called on aiolock.sync's own event loop thread (from an on_lost "
                "callback?): it would wait for itself. Keep callbacks short: set an event, "
                "and act on it in your thread"
            )
        raise RuntimeError(
            f"{what} was called from a thread that runs an asyncio event loop (an async "
            "view, a notebook cell): it would block that loop. Use aiolock's asyncio API "
            "there (aiolock.Lock ...), or run the sync code in a thread "
            "(await asyncio.to_thread(...))"
        )
    green = _green()
    if green is not None:
        raise RuntimeError(
            f"{what}: aiolock.sync does not run under {green}'s monkey-patching (a Celery "
            f"-P {green} pool, say): its leases are renewed by an event loop in a real "
            "thread, which green threads cannot wait for. Use a prefork or threads pool, "
            "or aiolock's asyncio API"
        )
