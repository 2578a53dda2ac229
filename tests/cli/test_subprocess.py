"""`python -m aiolock` and the `aiolock` script as real processes: what a user runs."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import signal
import subprocess
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from aiolock import LeaseLostError, Lock, LossReason

from ..conftest import make_client
from ..support.children import child, finished
from ..support.waits import within

pytestmark = pytest.mark.real_only

PYTHON = sys.executable


def clean_env() -> dict[str, str]:
    """The environment without REDIS_URL: nothing may fall back to a shared server."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


INTERRUPTIBLE = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('aiolock', run_name='__main__', alter_sys=True)"
)
"""`python -m aiolock`, with Ctrl-C (SIGINT) handled as in a program started from a terminal
whatever this process was started with: a shell without job control starts a background
command with SIGINT ignored, its children inherit that, and Python then leaves it ignored
(so `aiolock watch` would rightly not stop)."""


def aiolock_process(
    *argv: str, stdin: int | None = subprocess.DEVNULL
) -> AbstractAsyncContextManager[asyncio.subprocess.Process]:
    """`python -m aiolock ARGV` for the block (ended with it, however it ends)."""
    return child("python", "-c", INTERRUPTIBLE, *argv, stdin=stdin, env=clean_env())


async def test_python_m_aiolock_sees_a_lock_held_here(server_url: str, tag: str) -> None:
    client = make_client(server_url)
    try:
        async with (
            Lock(client, f"{tag}:orders", ttl=10) as lease,
            aiolock_process("ls", f"{tag}:*", "--url", server_url, "--json") as process,
        ):
            out, err = await finished(process, what="aiolock ls")
        assert process.returncode == 0, err.decode()
        (row,) = json.loads(out)
        assert row["name"] == f"{tag}:orders"
        assert row["fencing_token"] == lease.fencing_token
        assert row["pid"] == os.getpid()
    finally:
        await client.aclose()


def test_the_console_script_is_installed() -> None:
    script = Path(PYTHON).parent / "aiolock"
    if not script.exists():
        pytest.skip("the project is not installed with its scripts (pip install -e .)")
    done = subprocess.run(
        [str(script), "--version"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=30,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("aiolock ")


async def test_ctrl_c_ends_watch_with_130(server_url: str, tag: str) -> None:
    async with aiolock_process(
        "--url", server_url, "watch", f"{tag}:*", "--json", "--interval", "0.05"
    ) as process:
        assert process.stdout is not None
        first = await within(process.stdout.readline(), what="watch's first refresh", timeout=30)
        assert json.loads(first) == []  # it is running: one refresh printed
        process.send_signal(signal.SIGINT)
        _, err = await finished(process, what="aiolock watch after SIGINT")
    assert process.returncode == 130
    assert err.decode().splitlines()[-1] == "aiolock: interrupted"


def test_without_rich_the_cli_names_the_extra(server_url: str) -> None:
    code = (
        "import sys; sys.modules['rich'] = None\n"
        "from aiolock.cli import main\n"
        f"sys.exit(main(['--url', {server_url!r}, 'ls']))\n"
    )
    done = subprocess.run(
        [PYTHON, "-c", code],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert 'pip install "aiolock-redis[cli]"' in done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize(("answer", "code"), [("y", 0), ("n", 1)])
async def test_release_asks_on_a_terminal(
    server_url: str, tag: str, answer: str, code: int
) -> None:
    name = f"{tag}:asked"
    client = make_client(server_url)
    lease = await Lock(client, name, ttl=10).acquire()
    main_fd, terminal_fd = pty.openpty()
    try:
        os.write(main_fd, f"{answer}\n".encode())  # typed ahead; read when it asks
        async with aiolock_process(
            "--url", server_url, "release", name, "--force", stdin=terminal_fd
        ) as process:
            out, err = await finished(process, what="aiolock release --force")
        assert process.returncode == code, err.decode()
        text = out.decode()
        assert f"release lock {name!r}" in text  # the question, naming the holder
        assert str(lease.fencing_token) in text
        if answer == "y":
            assert "released lock" in text
            with pytest.raises(LeaseLostError) as lost:
                await lease.release()
            assert lost.value.reason is LossReason.NOT_OWNER
        else:
            assert "nothing released" in text
            await lease.extend()  # still ours
            await lease.release()
    finally:
        os.close(main_fd)
        os.close(terminal_fd)
        await client.aclose()


async def test_demo_in_processes_against_a_given_server(server_url: str) -> None:
    async with aiolock_process(
        "--url", server_url, "demo", "--json", "--stock", "30", "--workers", "6",
        "--processes", "2", "--hold", "0.005", "--slow-holds", "1", "--slow-hold", "0.3",
    ) as process:  # fmt: skip
        out, err = await finished(process, what="aiolock demo", timeout=120)
    assert process.returncode == 0, err.decode()
    summary = json.loads(out)
    assert summary["mode"] == "processes" and summary["processes"] == 2
    assert (summary["sold"], summary["oversold"], summary["ok"]) == (30, 0, True)
    assert summary["holds_over_ttl"] >= 1
    client = make_client(server_url)  # a shared server keeps nothing of the demo
    run_id = summary["hold_stats"]["name"].split(":")[1]
    try:
        assert [key async for key in client.scan_iter(f"aiolock-demo:{{{run_id}}}*")] == []
        assert [key async for key in client.scan_iter(f"aiolock:{{demo:{run_id}:*")] == []
    finally:
        await client.aclose()


@pytest.mark.slow
def test_demo_with_defaults_and_no_redis_url() -> None:
    """What CI and a new user run: no REDIS_URL, no --url, the default sale."""
    done = subprocess.run(
        [PYTHON, "-m", "aiolock", "demo", "--json"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["ok"] is True
    assert summary["sold"] == summary["stock"] == 100
    assert summary["oversold"] == 0
    assert summary["stock_left"] == 0
    assert summary["mode"] == "processes"  # a throwaway real server was found
    assert summary["holds_over_ttl"] >= 1
    assert summary["renewals"] > 0
