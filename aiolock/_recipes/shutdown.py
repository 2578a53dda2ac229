"""Releasing every held lock when the process is told to stop (SIGTERM in a rolling deploy).

Python's default SIGTERM ends the process at once: no `finally` runs, and every lock it
held stays taken until its ttl runs out. `release_all` ends the holders properly instead:

1. the body of each `async with` holding a lease is cancelled (its task gets a
   `CancelledError`, as on any shutdown), so it stops while the lock still protects it;
   a body still in its block half a second later is cancelled again (a cancellation can
   be lost on the way), and so on;
2. the `async with` releases its lease on the way out, as always (token-guarded);
3. leases held outside `async with` (from `acquire()`), which have no body to cancel, are
   released directly; their holders see `lease.held` turn False;
4. a body that does not end within the timeout keeps its lease: releasing under running
   code would leave it unprotected. Its key expires by its ttl after the process is gone.

Under a web server (uvicorn, gunicorn, aiohttp's runner), `release_on_signals(drain=...)`
hands the signal to the server at once, so that it drains as it would without aiolock,
and does the above only for the lock holders still running just before the server's
graceful timeout ends; the web helpers answer their requests 503 (`is_shutdown`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, final

from .._engine.lease import Lease, held_leases
from .._model.config import check_seconds
from ..errors import AiolockError

__all__ = ("DRAIN_MARGIN", "ReleaseReport", "is_shutdown", "release_all", "release_on_signals")

logger = logging.getLogger("aiolock")

_CANCEL_MESSAGE: Final = "aiolock: the process is shutting down (release_all)"
REDELIVER_AFTER: Final = 0.5
"""Seconds after which a body still in its block is cancelled again."""
DRAIN_MARGIN: Final = 0.5
"""With `drain`, how long before the server's graceful timeout ends the lock holders still
running are cancelled: time for their requests to be answered (503) and their locks
released before the server cancels what is left."""


def is_shutdown(error: BaseException) -> bool:
    """Whether `error` is the cancellation `release_all` delivers to a lock holder's body
    (the process is shutting down), rather than any other."""
    return isinstance(error, asyncio.CancelledError) and error.args[:1] == (_CANCEL_MESSAGE,)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseReport:
    """What `release_all` did, by lock name.

    Added in 0.1.
    """

    cancelled: tuple[str, ...]
    """Locks whose `async with` body was cancelled, then released on its way out."""
    released: tuple[str, ...]
    """Locks held outside `async with`, released directly."""
    still_held: tuple[str, ...]
    """Locks still held: a body that did not end within the timeout (or the caller's own
    body); their keys expire by their ttl."""


def _body_task(lease: Lease) -> asyncio.Task[Any] | None:
    """The task running the `async with` body this lease guards; None if it guards none."""
    return lease._guarded


async def _wait_for_bodies(cancelled: list[Lease], deadline: float) -> None:
    """Wait until the cancelled bodies have ended and released their leases, or until
    `deadline`. A body still in its block REDELIVER_AFTER seconds after its cancellation is
    cancelled again, and so on: a cancellation can be lost on the way (redis-py's calls
    lose one that lands mid-call now and then on Python 3.11), and the body then goes on
    as if nothing had happened."""
    loop = asyncio.get_running_loop()
    ends = {loop.create_task(lease.wait_lost()): lease for lease in cancelled}
    pending = set(ends)
    try:
        while pending:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            _, pending = await asyncio.wait(pending, timeout=min(remaining, REDELIVER_AFTER))
            for end in pending:
                task = _body_task(ends[end])
                if task is not None and not task.done():
                    task.cancel(_CANCEL_MESSAGE)
    finally:
        for end in ends:
            end.cancel()


async def release_all(*, timeout: float = 5.0) -> ReleaseReport:
    """Cancel the work of every lock this event loop holds, and release the locks.

    For a shutdown (SIGTERM) or a drain: see `release_on_signals` for the signal handler.
    Each `async with` body holding a lease gets a `CancelledError` (through its task, so
    the code after the block does not run as if the work had finished), and its block
    releases the lease on the way out. A body still in its block `REDELIVER_AFTER` (0.5)
    seconds later gets another, and so on until it leaves the block or the timeout
    passes: redis-py's calls lose a cancellation that lands mid-call now and then on
    Python 3.11, and the body then goes on as if nothing had happened. (A cleanup under
    `except CancelledError` that awaits for longer than that is cancelled again too; run
    one that must finish in a task of its own.) Leases held outside `async with` are
    released directly. Leases of other event loops are left alone.

    Args:
        timeout: seconds to wait for the cancelled bodies to end and the releases to be
            confirmed (0.01 to 1 year).

    Returns:
        A `ReleaseReport`. A body still running after `timeout` (it caught every
        cancellation) keeps its lease, listed in `still_held`, as does a lease whose body
        is the caller itself.

    Cancellation:
        Cancelling the caller stops the waiting; the bodies already cancelled go on
        unwinding and release their leases by themselves.

    Added in 0.1.
    """
    wait = check_seconds("timeout", timeout, minimum=0.01)
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    leases = [lease for lease in held_leases() if lease._loop is loop]
    cancelled: list[Lease] = []
    unguarded: list[Lease] = []
    own: list[Lease] = []
    for lease in leases:
        task = _body_task(lease)
        if task is None:
            unguarded.append(lease)
        elif task is me:
            own.append(lease)  # the body calling this: left to it
        else:
            if not task.done():
                task.cancel(_CANCEL_MESSAGE)
            cancelled.append(lease)
    deadline = loop.time() + wait
    for lease in unguarded:
        remaining = deadline - loop.time()
        with contextlib.suppress(AiolockError, TimeoutError):
            async with asyncio.timeout(max(remaining, 0.01)):
                await lease.release()
    if cancelled:
        await _wait_for_bodies(cancelled, deadline)
    still = [lease for lease in (*cancelled, *unguarded, *own) if lease.held]
    report = ReleaseReport(
        cancelled=tuple(lease.name for lease in cancelled if not lease.held),
        released=tuple(lease.name for lease in unguarded if not lease.held),
        still_held=tuple(lease.name for lease in still),
    )
    if leases:
        logger.info(
            "aiolock: shutting down: %d lock holder(s) cancelled and released, %d lease(s) "
            "released, %d still held",
            len(report.cancelled),
            len(report.released),
            len(report.still_held),
        )
    return report


def release_on_signals(
    signals: Iterable[signal.Signals] = (signal.SIGTERM,),
    *,
    timeout: float = 5.0,
    terminate: bool = True,
    drain: float | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> Callable[[], None]:
    """On each of `signals`, run `release_all`, then let the signal end the process.

    ```python
    async def main() -> None:
        aiolock.release_on_signals()      # SIGTERM: cancel lock holders, release, exit
        await run_workers()
    ```

    On the first signal the handlers are removed (a second signal acts at once, as it
    would without them), `release_all(timeout=timeout)` runs, and then, with `terminate`,
    the signal is raised again with the handler that was in place before: by default the
    process ends as it would have, with the locks already released. Without `terminate`
    the process goes on (the cancelled holders' tasks have ended); use that when your own
    shutdown code runs next.

    Under a web server, pass `drain`, the server's graceful timeout (uvicorn's
    `--timeout-graceful-shutdown`, gunicorn's `--graceful-timeout`, aiohttp's
    `shutdown_timeout`), and call it where the server's signal handler is already in place
    (a FastAPI/Starlette lifespan, an aiohttp `on_startup`):

    ```python
    @contextlib.asynccontextmanager
    async def lifespan(app):
        aiolock.release_on_signals(drain=10)   # uvicorn --timeout-graceful-shutdown 10
        yield
    ```

    Then the signal goes to the server's handler at once (a Python handler such as
    uvicorn's, or the event loop's such as aiohttp's), and the server drains as it would
    without aiolock: it stops accepting, and the requests in flight end and release their
    locks as usual. The lock holders still running `DRAIN_MARGIN` (0.5) seconds before
    `drain` ends are cancelled and released by `release_all`: a request of
    `aiolock.fastapi.locked_request` or `aiolock.aiohttp.locked_handler` is then answered
    503 Service Unavailable (with `Retry-After`), before the server cancels what is left
    (which would be a 500, or a closed connection). The signal is not raised again (the
    server had it); with no handler of a server in place (the default action), the
    signal is handled as without `drain`.

    Unix only (it uses `loop.add_signal_handler`). Call it from the event loop's thread.

    Args:
        signals: the signals to handle (default SIGTERM, what process managers and
            container runtimes send).
        timeout: passed to `release_all`.
        terminate: raise the signal again after releasing (without `drain`).
        drain: seconds the server gives requests in flight after the signal (1 to 1
            year); None (default): no server, release at once.
        loop: the event loop whose locks to release (default: the running one).

    Returns:
        A function that removes the handlers (and puts back the ones before).

    Raises:
        RuntimeError: no running event loop and no `loop` given.

    Added in 0.1.
    """
    check_seconds("timeout", timeout, minimum=0.01)
    if drain is not None:
        drain = check_seconds("drain", drain, minimum=1.0)
    chosen = tuple(signals)
    for sig in chosen:
        if not isinstance(sig, signal.Signals):
            raise TypeError(f"signals must be signal.Signals values, got {sig!r}")
    target = loop if loop is not None else asyncio.get_running_loop()
    previous = _Previous(target, chosen)
    installed: list[signal.Signals] = []
    running: set[asyncio.Task[None]] = set()

    def uninstall() -> None:
        while installed:
            sig = installed.pop()
            target.remove_signal_handler(sig)
            previous.restore(sig)

    async def shut_down(sig: signal.Signals) -> None:
        logger.warning("aiolock: %s received: releasing every held lock", sig.name)
        try:
            await release_all(timeout=timeout)
        finally:
            if terminate:
                signal.raise_signal(sig)

    async def drained(sig: signal.Signals, wait: float) -> None:
        logger.warning(
            "aiolock: %s received: the server drains; lock holders still running in %.3gs "
            "are cancelled and their locks released",
            sig.name,
            wait,
        )
        await asyncio.sleep(wait)  # the server's drain, less the margin
        await release_all(timeout=timeout)

    def on_signal(sig: signal.Signals) -> None:
        uninstall()
        if drain is not None and previous.is_servers(sig):
            work = drained(sig, max(drain - DRAIN_MARGIN, 0.0))
        else:
            work = shut_down(sig)
        task = target.create_task(work, name=f"aiolock release_on_signals {sig.name}")
        running.add(task)
        task.add_done_callback(running.discard)
        if drain is not None and previous.is_servers(sig):
            signal.raise_signal(sig)  # to the server's handler, put back: its drain starts

    try:
        for sig in chosen:
            target.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    except BaseException:
        uninstall()
        raise
    return uninstall


class _Previous:
    """The handlers in place before `release_on_signals`, per signal: the event loop's own
    (`loop.add_signal_handler`, as aiohttp's runner installs), else Python's
    (`signal.signal`, as uvicorn installs; or the default action); put back by `restore`."""

    __slots__ = ("_handlers", "_loop", "_loop_handlers")

    def __init__(self, loop: asyncio.AbstractEventLoop, signals: tuple[signal.Signals, ...]):
        self._loop = loop
        self._handlers = {sig: signal.getsignal(sig) for sig in signals}
        # The loop's own handlers: asyncio's Unix loop keeps them here (uvloop has none to
        # read); adding ours replaces them, so they are kept to be put back.
        known: dict[int, asyncio.Handle] = getattr(loop, "_signal_handlers", None) or {}
        self._loop_handlers = {sig: known[sig] for sig in signals if sig in known}

    def is_servers(self, sig: signal.Signals) -> bool:
        """Whether a handler of the program's (a server's) was in place, not the default
        action or nothing."""
        return sig in self._loop_handlers or callable(self._handlers[sig])

    def restore(self, sig: signal.Signals) -> None:
        handle = self._loop_handlers.get(sig)
        if handle is not None and not handle.cancelled():
            self._loop.add_signal_handler(sig, handle._callback, *handle._args)  # type: ignore[attr-defined]
            return
        before = self._handlers[sig]
        if before is not None:
            signal.signal(sig, before)
