"""The `aiolock` commands, run in-process against a real server; output read from --json."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socketserver
import threading
from collections.abc import Awaitable, Callable, Iterator

import pytest

from aiolock import LeaseLostError, Lock, LossReason
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock.cli import _inspection
from aiolock.cli._parser import build_parser
from aiolock.cli._text import CELL_LIMIT

from ..conftest import make_client
from ..support.load import scaled
from ..support.waits import within
from .conftest import Run, closed_port, eventually

pytestmark = pytest.mark.real_only

RunCli = Callable[..., Run]
AsyncRunCli = Callable[..., Awaitable[Run]]


async def test_ls_lists_held_locks_with_holder_fence_and_waiters(
    server_url: str, tag: str, arun: AsyncRunCli
) -> None:
    client = make_client(server_url)
    lease = await Lock(client, f"{tag}:orders:42", ttl=30).acquire()
    other = await Lock(client, f"{tag}:reports", ttl=10).acquire()
    waiters = [asyncio.create_task(Lock(client, f"{tag}:orders:42").acquire()) for _ in range(3)]
    # The process's entry in Redis counts its waiters at its first waiter's last attempt:
    # once all three are queued here, that waiter tries again (as a release would make it).
    notifier = runtime_for(client).notifier
    channel = LockKeys.build("aiolock", f"{tag}:orders:42").channel

    async def three_here() -> bool:
        return notifier.queue_length(channel) == 3

    await eventually(three_here, what="three local waiters")
    queue = notifier.queue_for(channel)
    assert queue is not None
    queue.wake_head()

    async def queued() -> bool:
        rows = (await arun("--url", server_url, "ls", f"{tag}:orders:*", "--json")).json()
        return bool(rows) and rows[0]["waiters"] == 3

    try:
        await eventually(queued, what="ls shows the three waiters")
        result = await arun("--url", server_url, "ls", f"{tag}:*", "--json")
        assert result.code == 0, result.err
        rows = result.json()
        assert [row["name"] for row in rows] == [f"{tag}:orders:42", f"{tag}:reports"]
        orders = rows[0]
        assert orders["state"] == "held"
        assert orders["fencing_token"] == lease.fencing_token
        assert orders["pid"] == os.getpid()
        assert orders["task"] == asyncio.current_task().get_name()  # type: ignore[union-attr]
        assert orders["waiters"] == 3
        assert orders["ttl"] == 30.0
        assert 0 < orders["expires_in"] <= 30
        assert 0 <= orders["age"] < 30
        assert rows[1]["waiters"] == 0
        assert rows[1]["ttl"] == 10.0

        table = await arun("--url", server_url, "ls", f"{tag}:*")
        assert table.code == 0
        assert f"{tag}:orders:42" in table.out
        assert str(lease.fencing_token) in table.out
    finally:
        await lease.release()
        await other.release()
        for next_holder in asyncio.as_completed(waiters):  # in whatever order they win
            await (await next_holder).release()
        await client.aclose()


def test_ls_with_nothing_held(server_url: str, tag: str, run: RunCli) -> None:
    assert run("--url", server_url, "ls", f"{tag}:*", "--json").json() == []
    result = run("--url", server_url, "ls", f"{tag}:*")
    assert result.code == 0
    assert "no locks, semaphores, rwlocks or elections in use" in result.out


async def test_show_tells_everything_about_one_lock(
    server_url: str, tag: str, arun: AsyncRunCli
) -> None:
    name = f"{tag}:inventory"
    client = make_client(server_url)
    lock = Lock(client, name, ttl=20, hold_stats=True)
    for _ in range(4):
        async with lock:
            pass
    lease = await lock.acquire()
    waiter = asyncio.create_task(Lock(client, name).acquire())

    async def queued() -> bool:
        shown = (await arun("--url", server_url, "show", name, "--json")).json()
        return bool(shown["lock"]["queue"])

    try:
        await eventually(queued, what="show lists the queue")
        result = await arun("--url", server_url, "show", name, "--json")
        assert result.code == 0, result.err
        assert result.json()["semaphore"] is result.json()["rwlock"] is None  # no others
        shown = result.json()["lock"]
        assert shown["name"] == name
        assert (shown["kind"], shown["limit"], shown["held"], shown["free"]) == ("lock", 1, 1, None)
        assert shown["key"] == f"aiolock:{{{name}}}"
        assert shown["state"] == "held"
        assert shown["holder"]["fencing_token"] == lease.fencing_token
        assert shown["holder"]["pid"] == os.getpid()
        assert "token" not in shown["holder"]  # never the secret
        assert shown["last_fencing_token"] == lease.fencing_token
        assert shown["waiters"] == 1
        (entry,) = shown["queue"]
        assert (entry["position"], entry["count"], entry["pid"]) == (1, 1, os.getpid())
        assert entry["expired"] is False
        assert len(shown["recent_holds_ms"]) == 4
        assert shown["hold_stats"]["count"] == 4
        assert shown["hold_stats"]["ttl"] == 20.0

        table = await arun("--url", server_url, "show", name)
        assert table.code == 0
        for text in ("fencing token", str(lease.fencing_token), "queue", "recent holds: 4"):
            assert text in table.out
    finally:
        await lease.release()
        await (await within(waiter, what="the waiter to get the lock")).release()
        await client.aclose()


async def test_a_lock_in_transit_to_the_next_process(
    server_url: str, tag: str, arun: AsyncRunCli
) -> None:
    """Between a release and the claim, the lock is reserved for the first queued process
    (for a minute here: the commands below may take seconds on a loaded machine)."""
    name = f"{tag}:transit"
    keys = LockKeys.build("aiolock", name)
    client = make_client(server_url)
    try:
        await client.hset(keys.lock, "reserved", "q-next")
        await client.pexpire(keys.lock, 60_000)
        (row,) = (await arun("--url", server_url, "ls", f"{tag}:*", "--json")).json()
        assert (row["state"], row["reserved_for"], row["fencing_token"]) == (
            "reserved",
            "q-next",
            None,
        )
        assert "(handed over)" in (await arun("--url", server_url, "ls", f"{tag}:*")).out
        shown = await arun("--url", server_url, "show", name)
        assert shown.code == 0
        assert "reserved for" in shown.out and "q-next" in shown.out
        released = await arun("--url", server_url, "release", name, "--force", "--yes")
        assert released.code == 1
        assert "not held" in released.out
    finally:
        await client.delete(keys.lock)
        await client.aclose()


def test_show_an_unknown_lock_fails(server_url: str, tag: str, run: RunCli) -> None:
    result = run("--url", server_url, "show", f"{tag}:nothing")
    assert result.code == 1
    assert "nothing known" in result.out
    shown = run("--url", server_url, "show", f"{tag}:nothing", "--json")
    assert shown.code == 1
    assert shown.json() == {
        "name": f"{tag}:nothing",
        "lock": None,
        "semaphore": None,
        "rwlock": None,
        "election": None,
    }


async def test_stats_per_lock_with_recommendation(
    server_url: str, tag: str, arun: AsyncRunCli
) -> None:
    client = make_client(server_url)
    # The holds are judged against a ttl of 0.1 s (--ttl below); the leases' own ttls are
    # longer than a loaded machine's stalls (the slow one, renewed, is held past 0.1 s).
    ttl = scaled(0.1)
    async with Lock(client, f"{tag}:slow", ttl=ttl, hold_stats=True):
        await asyncio.sleep(ttl * 1.5)  # kept past its ttl by the watchdog
    async with Lock(client, f"{tag}:fixed", ttl=scaled(0.5), renew=False, hold_stats=True):
        await asyncio.sleep(0.08)  # more than half of the 0.1 s judged against below
    for _ in range(3):
        async with Lock(client, f"{tag}:fast", ttl=5, hold_stats=True):
            pass
    held = await Lock(client, f"{tag}:held", ttl=8).acquire()
    try:
        result = await arun("--url", server_url, "stats", f"{tag}:*", "--json", "--ttl", "0.1")
        assert result.code == 0, result.err
        stats = {row["name"]: row for row in result.json()}
        assert set(stats) == {f"{tag}:slow", f"{tag}:fixed", f"{tag}:fast", f"{tag}:held"}
        slow, fixed, fast = stats[f"{tag}:slow"], stats[f"{tag}:fixed"], stats[f"{tag}:fast"]
        # A renewed lease outliving its ttl is by design: no warning, no ttl from its holds.
        assert (slow["count"], slow["fixed"], slow["over_ttl"]) == (1, 0, 1)
        assert slow["near_ttl"] is False and slow["recommended_ttl"] is None
        assert "crashed holder" in slow["advice"]
        # One that is not renewed must finish within its ttl: warned, and a ttl recommended.
        assert (fixed["count"], fixed["fixed"], fixed["over_ttl"]) == (1, 1, 0)
        assert fixed["near_ttl"] is True and fixed["ttl"] == 0.1
        assert fixed["recommended_ttl"] == 1.0 and fixed["fixed_p99"] >= 0.08
        assert "raise it" in fixed["advice"]
        assert fast["count"] == 3 and fast["p50"] <= fast["p99"] <= fast["max"]
        assert stats[f"{tag}:held"]["ttl"] == 8.0  # a held lock: the holder's ttl
        assert stats[f"{tag}:held"]["count"] == 0

        unknown_ttl = (await arun("--url", server_url, "stats", f"{tag}:fixed", "--json")).json()
        assert unknown_ttl[0]["ttl"] is None and unknown_ttl[0]["near_ttl"] is False

        table = await arun("--url", server_url, "stats", f"{tag}:*", "--ttl", "0.1")
        assert "unrenewed holds near the ttl" in table.out
        assert "renewed (1 past the ttl): fine" in table.out
    finally:
        await held.release()
        await client.aclose()


async def test_forced_release_is_detected_by_the_holders_watchdog(
    server_url: str, tag: str, arun: AsyncRunCli
) -> None:
    name = f"{tag}:stuck"
    client = make_client(server_url)
    try:
        lease = await Lock(client, name, ttl=1).acquire()  # renewed every 1/3 s
        result = await arun("--url", server_url, "release", name, "--force", "--yes", "--json")
        assert result.code == 0, result.err
        done = result.json()
        assert done["outcome"] == "released"
        assert done["holder"]["fencing_token"] == lease.fencing_token
        assert done["handed_to"] is None
        error = await asyncio.wait_for(lease.wait_lost(), timeout=5)
        assert isinstance(error, LeaseLostError)
        assert error.reason is LossReason.NOT_OWNER
        assert lease.loss_reason is LossReason.NOT_OWNER
        with pytest.raises(LeaseLostError):
            await lease.release()

        again = await arun("--url", server_url, "release", name, "--force", "--yes")
        assert again.code == 1
        assert "not held" in again.out
    finally:
        await client.aclose()


async def test_release_says_what_it_did(server_url: str, tag: str, arun: AsyncRunCli) -> None:
    name = f"{tag}:said"
    client = make_client(server_url)
    try:
        lease = await Lock(client, name, ttl=5).acquire()
        result = await arun("--url", server_url, "release", name, "--force", "--yes")
        assert result.code == 0
        assert f"released lock {name!r}" in result.out
        assert str(lease.fencing_token) in result.out
        with pytest.raises(LeaseLostError):
            await lease.release()
    finally:
        await client.aclose()


def test_release_needs_force(server_url: str, tag: str, run: RunCli) -> None:
    result = run("--url", server_url, "release", f"{tag}:x", "--yes")
    assert result.code == 2
    assert "--force" in result.err


def test_release_without_a_tty_and_without_yes_refuses(
    server_url: str, tag: str, run: RunCli
) -> None:
    result = run("--url", server_url, "release", f"{tag}:x", "--force")
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert "not a terminal" in result.err and "--yes" in result.err
    assert result.out == ""


def test_watch_refreshes_count_times(server_url: str, tag: str, run: RunCli) -> None:
    result = run(
        "--url", server_url, "watch", f"{tag}:*", "--json", "--count", "3", "--interval", "0.01"
    )
    assert result.code == 0, result.err
    assert result.out.splitlines() == ["[]", "[]", "[]"]
    table = run("--url", server_url, "watch", f"{tag}:*", "--count", "2", "--interval", "0.01")
    assert table.code == 0
    assert "0 lock(s), 0 semaphore(s), 0 rwlock(s), 0 election(s) in use" in table.out


@pytest.mark.parametrize("json_output", [True, False], ids=["json", "table"])
async def test_watch_ends_on_a_cancellation_a_library_swallowed(
    server_url: str, tag: str, monkeypatch: pytest.MonkeyPatch, json_output: bool
) -> None:
    """Ctrl-C cancels the command's task (asyncio.run does). On Python 3.11,
    `asyncio.wait_for` loses a cancellation that lands as the awaited call completes, and
    redis-py sends with it when the client has a socket timeout (the command line's has):
    the task then goes on, cancelled in name only. `watch` must end anyway, at its next
    refresh, rather than refresh for ever."""
    reads = 0

    async def held_swallowing_a_cancellation(*args: object, **kwargs: object) -> list[object]:
        nonlocal reads
        reads += 1
        if reads == 2:  # Ctrl-C during the second refresh, swallowed on the way
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)
        return []

    monkeypatch.setattr(_inspection, "_held", held_swallowing_a_cancellation)
    argv = ["--url", server_url, "watch", f"{tag}:*", "--interval", "0.01"]
    args = build_parser().parse_args(argv + (["--json"] if json_output else []))
    watching = asyncio.create_task(_inspection.watch_command(args, server_url))
    try:
        with pytest.raises(asyncio.CancelledError):
            await within(asyncio.shield(watching), what="watch to end after the cancellation")
    finally:
        watching.cancel()
    assert reads == 2


async def test_watch_shows_a_held_lock(server_url: str, tag: str, arun: AsyncRunCli) -> None:
    client = make_client(server_url)
    try:
        async with Lock(client, f"{tag}:watched", ttl=5) as lease:
            result = await arun(
                "--url", server_url, "--prefix", "aiolock", "watch", f"{tag}:*", "--json",
                "--count", "1",
            )  # fmt: skip
        (line,) = result.out.splitlines()
        assert f'"fencing_token": {lease.fencing_token}' in line
    finally:
        await client.aclose()


def test_unreachable_server_is_a_one_line_error(tag: str, run: RunCli) -> None:
    url = f"redis://127.0.0.1:{closed_port()}/0"
    for argv in (["ls"], ["show", tag], ["stats"], ["release", tag, "--force", "--yes"]):
        result = run("--url", url, *argv)
        assert result.code == 2, argv
        assert result.out == ""
        assert result.err.count("\n") == 1
        assert result.err.startswith(f"aiolock: cannot talk to Redis at {url}: ")


@pytest.fixture
def not_redis() -> Iterator[str]:
    """A server on a loopback port that answers like a web server."""

    class Http(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(1024)
            self.request.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Http)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{server.server_address[1]}/0"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_server_that_is_not_redis_is_a_one_line_error(not_redis: str, run: RunCli) -> None:
    result = run("--url", not_redis, "ls")
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert result.err.startswith(f"aiolock: cannot talk to Redis at {not_redis}: ")
    assert "rotocol" in result.err


def test_usage_errors(run: RunCli) -> None:
    assert run("--url", "http://example.invalid/", "ls").code == 2
    bad_url = run("--url", "http://example.invalid/", "ls")
    assert "invalid --url" in bad_url.err
    assert run("frobnicate").code == 2
    assert run("watch", "--count", "0").code == 2
    assert run("--help").code == 0
    assert "exit codes" in run("--help").out
    assert run("--version").code == 0


def test_password_is_not_shown_in_errors(run: RunCli) -> None:
    url = f"redis://user:s3cret@127.0.0.1:{closed_port()}/0"
    result = run("--url", url, "ls")
    assert result.code == 2
    assert "s3cret" not in result.err
    assert "user:***@127.0.0.1" in result.err


def test_demo_on_fakeredis_checks_its_invariant(run: RunCli) -> None:
    result = run(
        "demo", "--fakeredis", "--json", "--stock", "20", "--workers", "6", "--processes", "2",
        "--ttl", "0.1", "--hold", "0.005", "--slow-holds", "1", "--slow-hold", "0.25",
    )  # fmt: skip
    assert result.code == 0, result.err
    summary = result.json()
    assert summary["ok"] is True
    assert summary["mode"] == "tasks"
    assert (summary["sold"], summary["stock"], summary["stock_left"]) == (20, 20, 0)
    assert summary["oversold"] == 0
    # One sale per hold, then each worker sees it sold out: 26 holds when no lease is lost
    # (its 0.1 s ttl is lost to a stall of the process on a loaded machine). Each lost
    # lease may add a hold (one that sold nothing, its fenced read or write refused; or a
    # look at the sold-out stock, taken again) or leave a sale unrecorded (its block
    # cancelled by the loss after the write).
    lost = summary["losses"]
    assert 20 + 6 - lost <= summary["holds"] <= 20 + 6 + lost, summary
    assert summary["holds_over_ttl"] >= 1
    assert summary["renewals"] >= 2  # the slow hold lived on renewals
    assert set(summary["handoff_ms"]) == {"p50", "p90", "p99", "max"}
    # The slow holds outlived the ttl on renewals, by design: no ttl warning.
    assert summary["hold_stats"]["over_ttl"] >= 1 and summary["hold_stats"]["near_ttl"] is False


def test_demo_table(run: RunCli) -> None:
    result = run(
        "demo", "--fakeredis", "--stock", "5", "--workers", "2", "--hold", "0.001",
        "--slow-holds", "0",
    )  # fmt: skip
    assert result.code == 0, result.err
    for text in ("sold", "5 of 5", "oversold", "hand-off", "invariant holds"):
        assert text in result.out


async def test_piped_tables_cut_no_cell(
    server_url: str, tag: str, arun: Callable[..., Awaitable[Run]]
) -> None:
    """Piped, with COLUMNS unset, `ls` and `show` print every cell whole: a long name, the
    holder's host and pid, and a long task name are not cut short ("…"), up to the cell
    limit (60 characters: past it a value is shown cut, saying its length)."""
    task_name = "Task-billing-nightly-reconciliation-for-every-region-" + "x" * 7
    name = f"{tag}:" + "orders:" * 5 + "42"
    assert len(task_name) == len(name) + 8 == CELL_LIMIT
    client = make_client(server_url)
    entered, done = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with Lock(client, name, ttl=30):
            entered.set()
            await done.wait()

    task = asyncio.create_task(holder(), name=task_name)
    try:
        await within(entered.wait(), what="the lock held")
        for argv in (("ls", f"{tag}:*"), ("show", name)):
            result = await arun("--url", server_url, *argv)
            assert result.code == 0, result.err
            assert "…" not in result.out, result.out
            assert task_name in result.out, result.out
            assert name in result.out, result.out
            assert str(os.getpid()) in result.out, result.out
    finally:
        done.set()
        await task
        await client.aclose()
