"""Ports chosen for throwaway servers, kept from the other processes on this machine that
choose ports the same way (a second test suite run beside this one, a CI lane beside
another).

A port found free can be taken by another process before the server binds it, and a
server's port is free again between a `stop()` and the `start()` that restarts it there.
Each process therefore claims the ports it chooses: a claim is a POSIX record lock on the
byte at the port's offset in one shared file, held until the process ends or the claim
is among the oldest beyond `HELD`. A port claimed by another process is not chosen, and
a restart on a port another process has claimed since is refused as taken.

Where record locks are not available (Windows, or the shared file cannot be opened),
every claim succeeds: the servers' own retries on a taken port are what is left.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Final

if sys.platform != "win32":
    import fcntl

__all__ = ("HELD", "claim", "claimed_here", "release")

HELD: Final = 4096
"""How many claims a process keeps at most; the oldest is given up for a new one."""

BOOK_PATH: Final = Path(tempfile.gettempdir()) / "aiolock-testing-ports"
"""The shared file whose bytes stand for ports (it stays empty: locks need no data)."""


class _Book:
    """This process's claims, in the order they were made."""

    def __init__(self, path: Path, *, held: int = HELD) -> None:
        self._path = path
        self._cap = held
        self._fd: int | None = None
        self._pid = -1
        self._held: OrderedDict[int, None] = OrderedDict()
        self._mutex = threading.Lock()

    def _file(self) -> int | None:
        if sys.platform == "win32":  # pragma: no cover - no record locks
            return None
        if self._pid != os.getpid():
            # A forked child holds none of its parent's locks (they are per process);
            # closing the inherited descriptor would not touch the parent's either.
            self._held.clear()
            self._fd, self._pid = None, os.getpid()
            with contextlib.suppress(OSError):
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o666)
        return self._fd

    def claim(self, port: int) -> bool:
        with self._mutex:
            fd = self._file()
            if fd is None or port in self._held:
                if fd is not None:
                    self._held.move_to_end(port)
                return True
            if not self._lock(fd, port):
                return False
            self._held[port] = None
            while len(self._held) > self._cap:
                oldest, _ = self._held.popitem(last=False)
                self._unlock(fd, oldest)
            return True

    def release(self, port: int) -> None:
        with self._mutex:
            fd = self._file()
            if fd is not None and port in self._held:
                del self._held[port]
                self._unlock(fd, port)

    def close(self) -> None:
        """Give up every claim at once (closing the file ends the process's locks on it)."""
        with self._mutex:
            if self._fd is not None and self._pid == os.getpid():
                os.close(self._fd)
            self._fd, self._pid = None, -1
            self._held.clear()

    def holds(self, port: int) -> bool:
        with self._mutex:
            return self._file() is not None and port in self._held

    @staticmethod
    def _lock(fd: int, port: int) -> bool:
        if sys.platform == "win32":  # pragma: no cover - no record locks
            return True
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
        except OSError:
            return False
        return True

    @staticmethod
    def _unlock(fd: int, port: int) -> None:
        if sys.platform != "win32":
            with contextlib.suppress(OSError):
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, port)


_book = _Book(BOOK_PATH)


def claim(port: int) -> bool:
    """Claim `port` for this process: False if another process holds it (then it is not
    to be used); True if it is this process's now (or was already)."""
    return _book.claim(port)


def release(port: int) -> None:
    """Give up this process's claim on `port` (nothing if it holds none)."""
    _book.release(port)


def claimed_here(port: int) -> bool:
    """Whether this process holds a claim on `port`."""
    return _book.holds(port)
