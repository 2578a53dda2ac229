"""The suite's hygiene, a pytest plugin (`tests/conftest.py` registers it):

- **Nothing a test starts outlives it.** After each test's teardown, a child process (or a
  descendant: this process is made the subreaper of its orphans, on Linux) or a file
  descriptor (socket, pipe, event loop, file) that appeared during the test and is still
  alive is a failure of that test's teardown, naming what was left; the processes are killed
  and the descriptors closed, so that they cannot disturb the tests after it. What a fixture
  of a wider scope (module, session) starts belongs to that fixture until it is finalized,
  and is checked then. At the session's end, anything still alive fails the run, naming the
  test (or fixture) that started it; under pytest-xdist the workers report to the
  controller.
- **A hung async test is stopped with its stacks, within its time limit.** pytest-timeout's
  alarm raised inside an event loop can be swallowed by whichever task is running; so an
  async test is also bounded inside its loop, a few seconds before pytest-timeout's limit:
  the test task is cancelled, and the failure shows where it and every other task of the
  loop were waiting. pytest-timeout stays as the outer bound (for a loop that never yields).

- **No error goes untold.** asyncio logs, as errors, what nobody else was told of: a task
  or future whose exception nobody took ("Task exception was never retrieved", when it is
  collected), a task destroyed while still pending, a callback that raised. Such a log
  during a test fails that test's teardown, naming it; one logged between tests, or after
  the last, fails the run.

Linux only for the process and descriptor checks (they read /proc); elsewhere they are off.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import inspect
import io
import logging
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from aiolock.testing import _ports
from aiolock.testing._servers import family, tcp_sockets

PROC = Path("/proc")
GRACE = 3.0
"""How long a process that is ending (signalled, its parent gone) gets to be gone before it
counts as left running."""
ASYNC_MARGIN = 5.0
"""How long before pytest-timeout's limit an async test is cancelled inside its loop."""
PR_SET_CHILD_SUBREAPER = 36
WORKER_KEY = "aiolock_leaks"


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    start: str
    """The start time in clock ticks (/proc/PID/stat field 22): with the pid, an identity."""
    command: str = field(compare=False)
    """Its command line when first seen (a server rewrites its own later)."""

    def __str__(self) -> str:
        return f"process {self.pid} ({self.command})"


def _stat(pid: int) -> tuple[str, str] | None:
    """The state letter and start time of `pid`, or None if there is no such process."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return fields[0], fields[19]


def _alive(proc: Proc) -> bool:
    """Running (or stopped): not gone, not a zombie, not a new process under its pid."""
    stat = _stat(proc.pid)
    return stat is not None and stat[0] not in {"Z", "X"} and stat[1] == proc.start


def _command(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    words = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    return words if len(words) <= 200 else words[:197] + "..."


def descendants() -> set[Proc]:
    """This process's living descendants."""
    found: set[Proc] = set()
    for pid in family(os.getpid())[1:]:
        stat = _stat(pid)
        if stat is not None and stat[0] not in {"Z", "X"}:
            found.add(Proc(pid, stat[1], _command(pid)))
    return found


def open_fds() -> set[tuple[int, str]]:
    """This process's open file descriptors, each with what it refers to (a socket's or a
    pipe's inode, a file's path): with the number, an identity."""
    found: set[tuple[int, str]] = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(PROC / "self" / "fd"):
            with contextlib.suppress(OSError):
                found.add((int(name), os.readlink(PROC / "self" / "fd" / name)))
    return found


_TCP_STATES = {
    "01": "established",
    "06": "time-wait",
    "07": "closed",
    "08": "close-wait",
    "0A": "listening",
}


def _sockets() -> dict[str, str]:
    """The TCP sockets by what a descriptor of each reads as: "local -> remote, state"."""
    return {
        target: f"{local[0]}:{local[1]} -> {remote[0]}:{remote[1]}, {_TCP_STATES.get(state, state)}"
        for target, (local, remote, state) in (tcp_sockets() or {}).items()
    }


def _holders(number: int) -> list[str]:
    """What holds descriptor `number`: its transport, and the redis-py connection over it."""
    objects = gc.get_objects()
    transports = [
        obj
        for obj in objects
        if isinstance(obj, asyncio.BaseTransport)
        and getattr(obj, "_sock", None) is not None
        and obj._sock.fileno() == number  # type: ignore[attr-defined]
    ]
    held = [f"{type(t).__name__}, closing: {t.is_closing()}" for t in transports]
    for obj in objects:
        writer = (
            getattr(obj, "_writer", None) if type(obj).__name__.endswith("Connection") else None
        )
        if writer is not None and getattr(writer, "transport", None) in transports:
            held.append(repr(obj))
    return held


def _described(fds: Iterable[tuple[int, str]]) -> list[str]:
    sockets = _sockets()
    said: list[str] = []
    for number, target in sorted(fds):
        detail = [sockets[target]] if target in sockets else []
        if target.startswith("socket:"):
            detail += _holders(number)
        said.append(
            f"descriptor {number} ({target}{'; ' + '; '.join(detail) if detail else ''}) "
            "is still open"
        )
    return said


def _ignored(fd: tuple[int, str]) -> bool:
    """Descriptors that are not a test's: the standard streams, the directory listing
    that `open_fds` itself had open, and the file of the process's port claims (opened by
    the first test that chooses a port, kept open for the rest of the run: closing it
    would give up every claim)."""
    number, target = fd
    return (
        number <= 2
        or target == str(PROC / str(os.getpid()) / "fd")
        or target == str(_ports.BOOK_PATH)
    )


def _not_self_pipes(fds: set[tuple[int, str]]) -> set[tuple[int, str]]:
    """`fds` without the pipes whose two ends are both here: a self-pipe, such as the one
    uvloop (libuv) makes once per process for its signal handling and keeps. A child's
    pipe has its other end in the child; a leaked event loop is told by its epoll
    descriptor and its sockets."""
    ends: dict[str, int] = {}
    for _, target in fds:
        if target.startswith("pipe:"):
            ends[target] = ends.get(target, 0) + 1
    return {fd for fd in fds if ends.get(fd[1], 0) < 2}


def _collected_with_warnings() -> list[str]:
    """A garbage collection, and what the objects it collected complained of (a lease never
    released, a client never closed: their warnings, errors under `-W error`, would reach
    pytest as unraisable exceptions, reported on whichever test runs next)."""
    seen: list[str] = []

    def hook(unraisable: Any) -> None:
        where = f" in {unraisable.object!r}" if unraisable.object is not None else ""
        seen.append(
            f"garbage collected{where} complained: "
            f"{getattr(unraisable.exc_type, '__name__', '?')}: {unraisable.exc_value}"
        )

    previous = sys.unraisablehook
    sys.unraisablehook = hook
    try:
        gc.collect()
    finally:
        sys.unraisablehook = previous
    return seen


def _kill(procs: Iterable[Proc]) -> None:
    for proc in procs:
        if _alive(proc):
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGKILL)


def _become_subreaper() -> bool:
    """Orphans of this process's children become its children (Linux), so that a process
    left behind by a child that died is still seen here."""
    if not sys.platform.startswith("linux"):
        return False
    path = ctypes.util.find_library("c")
    if path is None:
        return False
    libc = ctypes.CDLL(path, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


class _AsyncioErrors(logging.Handler):
    """Keeps the errors asyncio logs: a task's (or future's) exception that nobody took, a
    task destroyed while pending, a callback that raised."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        told = f" ({type(error).__name__}: {error})" if error is not None else ""
        self.seen.append(f"asyncio logged: {' '.join(record.getMessage().split())}{told}")

    def drained(self) -> list[str]:
        seen, self.seen = self.seen, []
        return seen


@dataclass(slots=True)
class _Owned:
    """What a fixture of a wider scope started."""

    fixture: str
    started_in: str
    fixturedef: Any
    procs: set[Proc] = field(default_factory=set)
    fds: set[tuple[int, str]] = field(default_factory=set)


class Hygiene:
    """The plugin's state (one per pytest process; under xdist, one per worker)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.enabled = False  # decided at the session's start
        self.owned: dict[int, _Owned] = {}  # by id(fixturedef)
        self.first_seen: dict[Proc, str] = {}
        self.before_procs: set[Proc] = set()
        self.before_fds: set[tuple[int, str]] = set()
        self.current = "(collection)"
        self.pending_fixture_leaks: list[str] = []
        self.leaks: list[str] = []
        self.started_at: dict[str, float] = {}
        self.failed: set[str] = set()
        self.asyncio_errors = _AsyncioErrors()

    # ------------------------------------------------------------------ bookkeeping
    def _owned_procs(self) -> set[Proc]:
        return {proc for owned in self.owned.values() for proc in owned.procs}

    def _owned_fds(self) -> set[tuple[int, str]]:
        return {fd for owned in self.owned.values() for fd in owned.fds}

    def _note(self, procs: Iterable[Proc], where: str) -> None:
        for proc in procs:
            self.first_seen.setdefault(proc, where)

    def _left_running(self, candidates: set[Proc]) -> set[Proc]:
        """Those of `candidates` still alive after a grace period for the ending ones."""
        deadline = time.monotonic() + GRACE
        alive = {proc for proc in candidates if _alive(proc)}
        while alive and time.monotonic() < deadline:
            time.sleep(0.02)
            alive = {proc for proc in alive if _alive(proc)}
        return alive

    def _left_open(self, candidates: set[tuple[int, str]]) -> set[tuple[int, str]]:
        """Those of `candidates` still open after a garbage collection (an object that only
        a reference cycle kept is closed by it, with the ResourceWarning that the
        unraisable-exception check reports on this test)."""
        if not candidates:
            return candidates
        gc.collect()
        return candidates & open_fds()

    # ------------------------------------------------------------------ hooks
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        self.current = item.nodeid
        self.started_at[item.nodeid] = time.monotonic()
        self.leaks += [f"before {item.nodeid}: {seen}" for seen in self.asyncio_errors.drained()]
        if self.enabled:
            self.before_procs = descendants()
            self.before_fds = open_fds()
        return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        try:
            return (yield)
        finally:
            self.started_at.pop(item.nodeid, None)
            problems = self._after_test(item) if self.enabled else []
            if problems:
                raise pytest.fail.Exception(
                    f"{item.nodeid} left behind what it started (now ended here):\n  "
                    + "\n  ".join(problems),
                    pytrace=False,
                )

    def _adopt_restarted_servers(self, now: set[Proc]) -> None:
        """A server held by a fixture of a wider scope, restarted by a test (a new process
        under the same object), stays that fixture's."""
        for owned in self.owned.values():
            cached = getattr(owned.fixturedef, "cached_result", None)
            value = cached[0] if cached else None
            try:
                pid = getattr(value, "pid", None)
            except RuntimeError:  # a server object that is not running
                continue
            if isinstance(pid, int):
                owned.procs |= {proc for proc in now if proc.pid == pid}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.failed:
            self.failed.add(item.nodeid)
        return report

    def _after_test(self, item: pytest.Item) -> list[str]:
        """What the test left running or open (ended here), or collected with complaints."""
        if item.nodeid in self.failed:
            # A test that failed midway leaves objects that warn when collected (a lease
            # never released, a client never closed): collected now, their warnings are
            # reported on this test rather than on whichever test runs when they are.
            # pytest keeps the last failure (and so its frames) in `sys.last_*` for a
            # post-mortem; without --pdb nobody reads it.
            self.failed.discard(item.nodeid)
            if not self.config.getoption("usepdb", False):
                for attribute in ("last_exc", "last_type", "last_value", "last_traceback"):
                    if hasattr(sys, attribute):
                        setattr(sys, attribute, None)
            garbage = _collected_with_warnings()
        else:
            garbage = []
        now = descendants()
        self._adopt_restarted_servers(now)
        procs = now - self.before_procs - self._owned_procs()
        self._note(procs, item.nodeid)
        left = self._left_running(procs)
        fds = _not_self_pipes(
            {fd for fd in open_fds() - self.before_fds - self._owned_fds() if not _ignored(fd)}
        )
        open_left = self._left_open(fds)
        problems = [f"{proc} is still running" for proc in sorted(left, key=str)]
        problems += _described(open_left)
        problems += self.pending_fixture_leaks
        problems += garbage
        problems += self.asyncio_errors.drained()
        self.pending_fixture_leaks = []
        if not problems:
            return problems
        _kill(left)
        for number, _ in open_left:
            with contextlib.suppress(OSError):
                os.close(number)
        # Objects whose descriptors were closed here would warn when collected, on some later
        # test: this one reports them.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        self.leaks += [f"{item.nodeid}: {problem}" for problem in problems]
        return problems

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        if not self.enabled or fixturedef.scope == "function":
            return (yield)
        procs, fds = descendants(), open_fds()
        try:
            return (yield)
        finally:
            owned = self.owned.setdefault(
                id(fixturedef), _Owned(f"fixture {fixturedef.argname!r}", self.current, fixturedef)
            )
            owned.procs |= descendants() - procs
            owned.fds |= {fd for fd in open_fds() - fds if not _ignored(fd)}
            self._note(owned.procs, f"{owned.fixture} (set up for {self.current})")

    @pytest.hookimpl
    def pytest_fixture_post_finalizer(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> None:
        owned = self.owned.pop(id(fixturedef), None)
        if owned is None:
            return
        left = self._left_running(owned.procs)
        open_left = self._left_open(owned.fds)
        problems = [f"{proc} is still running" for proc in sorted(left, key=str)]
        problems += _described(open_left)
        if problems:
            _kill(left)
            for number, _ in open_left:
                with contextlib.suppress(OSError):
                    os.close(number)
            self.pending_fixture_leaks += [
                f"{owned.fixture}, set up for {owned.started_in}: {problem}" for problem in problems
            ]

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # Under pytest-xdist the controller runs no test: it only gathers what its workers
        # found (they are its children, alive until the end).
        controller = self.config.pluginmanager.getplugin("dsession") is not None
        self.enabled = PROC.joinpath("self", "fd").is_dir() and not controller
        if self.enabled:
            _become_subreaper()
        logging.getLogger("asyncio").addHandler(self.asyncio_errors)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        gc.collect()
        logging.getLogger("asyncio").removeHandler(self.asyncio_errors)
        self.leaks += [f"after the last test: {seen}" for seen in self.asyncio_errors.drained()]
        if self.enabled:
            left = self._left_running(descendants())
            _kill(left)
            self.leaks += [
                f"{self.first_seen.get(proc, 'not a test (started outside any test)')}: {proc} "
                "was still running at the end of the session"
                for proc in sorted(left, key=str)
            ]
            self.leaks += self.pending_fixture_leaks
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[WORKER_KEY] = list(self.leaks)
            return
        if self.leaks and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """Under pytest-xdist (the controller): what a worker found at its session's end."""
        output = getattr(node, "workeroutput", None) or {}
        self.leaks += [f"[{node.gateway.id}] {leak}" for leak in output.get(WORKER_KEY, ())]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if getattr(self.config, "workeroutput", None) is not None or not self.leaks:
            return
        terminalreporter.section("processes and descriptors left behind", red=True)
        for leak in self.leaks:
            terminalreporter.line(leak)

    # ------------------------------------------------------------------ async time limit
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        func = getattr(item, "obj", None)
        limit = self._async_limit(item)
        if limit is None or func is None or not inspect.iscoroutinefunction(func):
            return (yield)
        item.obj = _bounded(func, limit, item.nodeid)  # type: ignore[attr-defined]
        try:
            return (yield)
        finally:
            item.obj = func  # type: ignore[attr-defined]

    def _async_limit(self, item: pytest.Item) -> float | None:
        """Seconds the test call may still take before it is stopped inside its loop."""
        marker = item.get_closest_marker("timeout")
        timeout = None
        if marker is not None and marker.args:
            timeout = float(marker.args[0])
        elif marker is not None and "timeout" in marker.kwargs:
            timeout = float(marker.kwargs["timeout"])
        else:
            with contextlib.suppress(ValueError, TypeError):
                timeout = float(self.config.getini("timeout") or 0)
        if not timeout:
            return None
        started = self.started_at.get(item.nodeid, time.monotonic())
        spent = time.monotonic() - started
        return max(timeout - ASYNC_MARGIN - spent, timeout * 0.5 - spent, 0.5)


class AsyncTestTimeout(AssertionError):
    """An async test ran past its time limit and was cancelled inside its event loop."""


def _bounded(func: Callable[..., Any], limit: float, nodeid: str) -> Callable[..., Any]:
    """`func` (a coroutine function), cancelled after `limit` seconds with the stacks of
    every task of its loop at that moment."""

    @functools.wraps(func)
    async def bounded(*args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        stacks: list[str] = []

        def expire() -> None:
            if not stacks:
                stacks.append(_task_stacks(loop))
            task.cancel(f"{nodeid}: past its time limit ({limit:.3g}s)")
            handle[0] = loop.call_later(1.0, expire)  # a swallowed cancellation is repeated

        handle = [loop.call_later(limit, expire)]
        try:
            return await func(*args, **kwargs)
        except asyncio.CancelledError:
            if not stacks:
                raise
            task.uncancel()
            raise AsyncTestTimeout(
                f"stopped after {limit:.3g}s inside its event loop (a hang?); where every "
                f"task was at that moment:\n{stacks[0]}"
            ) from None
        finally:
            handle[0].cancel()

    return bounded


def _task_stacks(loop: asyncio.AbstractEventLoop) -> str:
    """Each task of `loop` with its chain of awaits, outermost first (asyncio's own stack of
    a suspended task shows its outermost coroutine only)."""
    out = io.StringIO()
    for task in asyncio.all_tasks(loop):
        out.write(f"--- task {task.get_name()!r}\n")
        awaited: Any = task.get_coro()
        for _ in range(40):
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                if awaited is not None:
                    out.write(f"    awaiting {awaited!r}\n")
                break
            code = frame.f_code
            out.write(f"    {code.co_filename}:{frame.f_lineno} in {code.co_name}\n")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return out.getvalue()


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Hygiene(config), "aiolock-hygiene")
