"""Stopping: `release_all`, `release_on_signals` (SIGTERM) and `shutdown` for sync code.

A synchronous body cannot be cancelled: `release_all` gives its lease back under it and
says so to the body (`check()`, `lost`, the block's exit raise `LeaseLostError`), stops
the acquisitions in progress (nothing left held), then releases every lease of the
process. At interpreter exit, and by `shutdown()`, the same is done before the background
loop stops and the connections close.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .._model.config import check_seconds
from .._recipes.shutdown import ReleaseReport
from ..errors import AiolockError
from . import _portal
from ._clients import close_twins
from ._lease import Lease, dropped, held_leases

__all__ = ("release_all", "release_on_signals", "shutdown")

logger = logging.getLogger("aiolock")

_NOTHING = ReleaseReport(cancelled=(), released=(), still_held=())


async def _release(lease: Lease) -> bool:
    """On the loop: give `lease` back; whether Redis confirmed it."""
    try:
        await lease._async.release()
    except (AiolockError, TimeoutError) as error:
        logger.warning("aiolock: could not release lock %r: %s", lease.name, error)
        return False
    return True


async def _release_every(timeout: float) -> ReleaseReport:
    """On the loop: stop the acquisitions in progress, and release every held lease, within
    `timeout`."""
    running = _portal.running_portal()
    stopped = running.stop_acquisitions() if running is not None else []
    leases = held_leases()
    dropped_releases = dropped()
    for lease in leases:
        lease._revoke()
    released: list[str] = []
    still: list[str] = []
    if leases:
        tasks = [asyncio.ensure_future(_release(lease)) for lease in leases]
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for lease, task in zip(leases, tasks, strict=True):
            ok = task.done() and not task.cancelled() and task.result()
            (released if ok else still).append(lease.name)
        for task in pending:
            task.cancel()
    if stopped:
        await asyncio.wait([future for _, future in stopped], timeout=timeout)
    if dropped_releases:
        # Leases dropped while held, being given back: let those releases end too.
        await asyncio.wait(dropped_releases, timeout=timeout)
    report = ReleaseReport(
        cancelled=tuple(label for label, _ in stopped),
        released=tuple(released),
        still_held=tuple(still),
    )
    if leases or stopped:
        logger.info(
            "aiolock: stopping: %d acquisition(s) stopped, %d lease(s) released, %d still held",
            len(stopped),
            len(released),
            len(still),
        )
    return report


def _release_all_now(timeout: float) -> ReleaseReport:
    running = _portal.running_portal()
    if running is None:
        return _NOTHING
    return running.run(lambda: _release_every(timeout), stop=False)


def release_all(*, timeout: float = 5.0) -> ReleaseReport:
    """Give back every lease this process holds through `aiolock.sync`, and stop the
    acquisitions in progress.

    For a shutdown or a drain (Celery's `worker_process_shutdown`, a SIGTERM handler: see
    `release_on_signals`). A body still running in its `with` block is not stopped (it
    cannot be): from now on its lease says it was given back (`lost` is True, `check()`
    and the block's exit raise `LeaseLostError`). A thread waiting in `acquire()` gets
    `RuntimeError`, with nothing left held or queued. Leases of asyncio code are left alone
    (see `aiolock.release_all`).

    Args:
        timeout: seconds to wait for the releases (0.01 to 1 year).

    Returns:
        A `ReleaseReport`: `released` (token-guarded releases confirmed), `still_held`
        (releases that failed or did not finish in time: their keys expire by their ttl),
        `cancelled` (the acquisitions stopped).

    Raises:
        RuntimeError: called from a thread that runs an event loop.

    Added in 0.1.
    """
    wait = check_seconds("timeout", timeout, minimum=0.01)
    _portal.check_caller("release_all()")
    return _release_all_now(wait)


def release_on_signals(
    signals: Iterable[signal.Signals] = (signal.SIGTERM,),
    *,
    timeout: float = 5.0,
    terminate: bool = True,
) -> Callable[[], None]:
    """On each of `signals`, run `release_all`, then let the signal end the process: the
    counterpart of `aiolock.release_on_signals` for synchronous code.

    ```python
    aiolock.sync.release_on_signals()    # SIGTERM: give every lock back, then exit
    ```

    Python's default SIGTERM ends the process at once: no `finally` runs, and every lock
    it held stays taken until its ttl. With this handler, the first signal removes the
    handlers (a second one acts at once), releases every held lease (token-guarded, within
    `timeout`) and stops the acquisitions in progress, then raises the signal again with
    the handler that was in place before: by default the process ends as it would have,
    its locks already free. Without `terminate` the process goes on (your own shutdown
    code runs next); the bodies still running learn that their leases were given back.

    In a Celery worker, call it in each pool process (the `worker_process_init` signal),
    where tasks run: Celery's own handlers stay in the main process, whose warm shutdown
    lets the tasks finish and release their locks themselves.

    Call it from the main thread (Python runs signal handlers there). Unix only.

    Args:
        signals: the signals to handle (default SIGTERM).
        timeout: passed to `release_all`.
        terminate: raise the signal again after releasing.

    Returns:
        A function that removes the handlers (and puts back the ones before).

    Raises:
        RuntimeError: not called from the main thread.

    Added in 0.1.
    """
    wait = check_seconds("timeout", timeout, minimum=0.01)
    chosen = tuple(signals)
    for sig in chosen:
        if not isinstance(sig, signal.Signals):
            raise TypeError(f"signals must be signal.Signals values, got {sig!r}")
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("release_on_signals() must be called from the main thread")
    previous = {sig: signal.getsignal(sig) for sig in chosen}
    installed: list[signal.Signals] = []

    def uninstall() -> None:
        while installed:
            sig = installed.pop()
            before = previous[sig]
            signal.signal(sig, before if before is not None else signal.SIG_DFL)

    def on_signal(signum: int, frame: Any) -> None:
        uninstall()
        sig = signal.Signals(signum)
        logger.warning("aiolock: %s received: releasing every held lock", sig.name)
        try:
            _release_all_now(wait)
        finally:
            if terminate:
                signal.raise_signal(sig)

    try:
        for sig in chosen:
            signal.signal(sig, on_signal)
            installed.append(sig)
    except BaseException:
        uninstall()
        raise
    return uninstall


def shutdown(*, timeout: float = 5.0) -> ReleaseReport:
    """Stop aiolock.sync's background thread: `release_all(timeout=timeout)`, then close
    its connections and its event loop. The next call of aiolock.sync starts it again.

    Done by itself at interpreter exit (`atexit`); call it yourself where a process stops
    without running `atexit` handlers (a `multiprocessing` or billiard child: Celery's
    `worker_process_shutdown` signal), or in tests.

    Raises:
        RuntimeError: called from a thread that runs an event loop.

    Added in 0.1.
    """
    wait = check_seconds("timeout", timeout, minimum=0.01)
    _portal.check_caller("shutdown()")
    report = _release_all_now(wait)
    _portal.stop()
    return report


def _on_stop(at_exit: bool) -> None:
    """The portal stops: what is still held is released, the clients are closed."""
    running = _portal.running_portal()
    if running is None:
        return
    _release_all_now(5.0)
    running.run(close_twins, stop=False)


_portal.on_stop(_on_stop)
