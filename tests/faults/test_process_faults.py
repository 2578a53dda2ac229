"""Process faults: a holder in another process is paused, killed, or its event loop blocked.

The holder is `tests/faults/holder.py`, run with `sys.executable` against the test's own
server; it reports what happened to it as JSON lines. This process plays the contender.
The test signals only the holder process it started, by its PID. What each test shows is
listed in docs/guarantees.md ("The holder's process").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Self

import pytest
import redis.asyncio

from aiolock import Lease, Lock
from aiolock._lua.layout import LockKeys
from aiolock._model.holder import text

from ..conftest import make_client
from ..support.children import ended
from ..support.load import scaled
from ..support.servers import RedisServer, all_closed
from .holder import fenced_write
from .test_network_faults import until

pytestmark = pytest.mark.real_only

ROOT = Path(__file__).resolve().parents[2]
EVENT_TIMEOUT = 20.0
"""Hang guard for one line of the holder (its start includes importing redis and aiolock)."""


class Holder:
    """A `tests.faults.holder` process and the events it printed so far."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.events: list[dict[str, Any]] = []
        self.stopped = False

    @classmethod
    async def start(cls, url: str, name: str, *args: str) -> Self:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.faults.holder",
            "--url",
            url,
            "--name",
            name,
            *args,
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(process)

    @property
    def pid(self) -> int:
        return self.process.pid

    def kinds(self) -> list[str]:
        return [event["event"] for event in self.events]

    async def next_event(self) -> dict[str, Any] | None:
        """The next line of the holder, or None at the end of its output."""
        assert self.process.stdout is not None
        async with asyncio.timeout(EVENT_TIMEOUT):
            line = await self.process.stdout.readline()
        if not line:
            return None
        event: dict[str, Any] = json.loads(line)
        self.events.append(event)
        return event

    async def wait_for(self, kind: str) -> dict[str, Any]:
        while (event := await self.next_event()) is not None:
            if event["event"] == kind:
                return event
            if event["event"] == "error":
                break
        stderr = await self._stderr()
        pytest.fail(f"the holder ended without {kind!r}: {self.events}\n{stderr}")

    async def finish(self) -> list[dict[str, Any]]:
        """Every remaining event until the holder exits; it must exit cleanly."""
        while await self.next_event() is not None:
            pass
        code = await asyncio.wait_for(self.process.wait(), EVENT_TIMEOUT)
        assert code == 0, f"holder exited with {code}: {await self._stderr()}"
        return self.events

    async def _stderr(self) -> str:
        assert self.process.stderr is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1):
                return (await self.process.stderr.read()).decode(errors="replace")
        return ""

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.stopped = False

    def kill(self) -> None:
        self.process.kill()

    async def close(self) -> None:
        """Make sure the process is gone and every pipe is closed."""
        await ended(self.process)


@pytest.fixture
async def holders() -> AsyncIterator[list[Holder]]:
    started: list[Holder] = []
    try:
        yield started
    finally:
        for holder in started:
            await holder.close()


@pytest.fixture
async def contender(server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    async with all_closed([make_client(server.url)]) as (client,):
        yield client


# --------------------------------------------------------------------------- SIGSTOP
async def test_a_holder_paused_past_its_ttl_learns_of_the_loss_on_resume(
    server: RedisServer, name: str, holders: list[Holder], contender: redis.asyncio.Redis
) -> None:
    """The holder process is frozen (like a long GC pause): another process acquires after
    the ttl; when the holder runs again it never leaves its block silently."""
    loop = asyncio.get_running_loop()
    ttl = 1.0
    holder = await Holder.start(server.url, name, "--ttl", str(ttl), "--mode", "hold")
    holders.append(holder)
    acquired = await holder.wait_for("acquired")
    holder.pause()
    paused_at = loop.time()
    lease = await Lock(contender, name, ttl=ttl).acquire(timeout=10)
    try:
        acquired_at = loop.time()
        assert lease.fencing_token > acquired["fencing_token"]
        # The holder's key was last renewed before the pause, with the full ttl.
        assert acquired_at <= paused_at + ttl + 0.5
        holder.resume()
        lost = await holder.wait_for("lost")
        assert lost["fencing_token"] == acquired["fencing_token"]
        assert lost["reason"] in {"deadline", "not_owner"}
        assert lost["t"] > acquired_at
        # The contender's lease was untouched by the holder's release attempt.
        info = await Lock(contender, name).info()
        assert info is not None and info.fencing_token == lease.fencing_token
    finally:
        await lease.release()
    events = await holder.finish()
    assert "completed" not in holder.kinds(), f"left its block silently: {events}"
    assert holder.kinds()[-2:] == ["lost", "exit"]


# --------------------------------------------------------------------------- SIGKILL
async def test_a_killed_holder_frees_the_lock_within_its_ttl(
    server: RedisServer, name: str, holders: list[Holder], contender: redis.asyncio.Redis
) -> None:
    loop = asyncio.get_running_loop()
    ttl = 1.0
    holder = await Holder.start(server.url, name, "--ttl", str(ttl), "--mode", "hold")
    holders.append(holder)
    acquired = await holder.wait_for("acquired")
    holder.kill()
    killed_at = loop.time()
    await holder.process.wait()
    lease = await Lock(contender, name, ttl=ttl).acquire(timeout=10)
    try:
        assert loop.time() <= killed_at + ttl + scaled(0.5)
        assert lease.fencing_token > acquired["fencing_token"]
    finally:
        await lease.release()
    assert holder.process.returncode == -signal.SIGKILL


# --------------------------------------------------------------------------- blocked loop
async def test_a_holder_whose_loop_was_blocked_past_its_ttl_is_fenced_off(
    server: RedisServer, name: str, holders: list[Holder], contender: redis.asyncio.Redis
) -> None:
    """The holder's event loop is blocked for longer than the ttl; meanwhile this process
    acquires and writes to a fenced store. On resume the holder's body is cancelled and it
    reports LeaseLostError, and the write it had started then is rejected by the store:
    its fencing token is lower than the new holder's."""
    ttl = 1.0
    fence_key = f"{name}:store"
    holder = await Holder.start(
        server.url, name, "--ttl", str(ttl), "--mode", "block", "--fence-key", fence_key
    )
    holders.append(holder)
    acquired = await holder.wait_for("acquired")  # its loop is blocked from here on
    old_token = int(acquired["fencing_token"])
    lease = await Lock(contender, name, ttl=ttl).acquire(timeout=10)
    try:
        assert lease.fencing_token > old_token
        assert await fenced_write(contender, fence_key, lease.fencing_token, "successor")
        holder.send("resume")
        events = await holder.finish()
        info = await Lock(contender, name).info()
        assert info is not None and info.fencing_token == lease.fencing_token
    finally:
        await lease.release()
    assert holder.kinds() == ["write", "acquired", "resumed", "write", "lost", "exit"], events
    assert "completed" not in holder.kinds()
    lost = events[4]
    assert lost["reason"] in {"deadline", "not_owner"}
    assert lost["fencing_token"] == old_token
    zombie = events[3]
    assert zombie["label"] == "zombie"
    assert zombie["accepted"] is False, "the store accepted a write from a lost lease"
    log = [
        entry.decode() if isinstance(entry, bytes) else str(entry)
        for entry in await contender.lrange(f"{fence_key}:log", 0, -1)
    ]
    assert log == [
        f"accepted:holder:{old_token}",
        f"accepted:successor:{lease.fencing_token}",
        f"rejected:zombie:{old_token}",
    ]
    assert await contender.get(f"{fence_key}:max") == str(lease.fencing_token).encode()


# --------------------------------------------------------------------------- dead waiter
async def test_a_killed_waiters_lapsed_entry_is_passed_over_by_the_release(
    server: RedisServer, name: str, holders: list[Holder], contender: redis.asyncio.Redis
) -> None:
    """A waiting process is killed while first in the lock's queue in Redis, and its
    entry's expiry passes while the lock stays held; a live waiter of another process is
    second. The release grants the lock to the live waiter, at once: nothing is granted to
    the lapsed entry (which would keep the lock from the live waiter for a grant's
    RESERVATION_MS)."""
    keys = LockKeys.build("aiolock", name)
    ttl = 1.0  # renewed: the waiters' entries live until ttl + GRACE_MS after their tries
    holding = make_client(server.url)
    live: asyncio.Task[Lease] | None = None
    try:
        holder = await Lock(holding, name, ttl=ttl).acquire()
        dead = await Holder.start(server.url, name, "--ttl", str(ttl), "--mode", "hold")
        holders.append(dead)

        async def entries() -> list[tuple[str, int, int]]:
            """(queue id, expiry in server ms, pid) of each entry, first in line first."""
            found = []
            for member in await holding.zrange(keys.queue, 0, -1):
                wid = text(member)
                entry = await holding.hget(keys.waiters, wid)
                if entry is not None:
                    until_ms, _, _, pid = text(entry).split(" ")[:4]
                    found.append((wid, int(until_ms), int(pid)))
            return found

        async def dead_queued() -> bool:
            return [pid for _, _, pid in await entries()] == [dead.pid]

        await until(dead_queued, "the waiting process queued in Redis", timeout=EVENT_TIMEOUT)
        dead.kill()
        await dead.process.wait()

        live = asyncio.create_task(Lock(contender, name, ttl=ttl).acquire(), name="live-waiter")

        async def both_queued() -> bool:
            return [pid for _, _, pid in await entries()] == [dead.pid, os.getpid()]

        await until(both_queued, "the live waiter queued second", timeout=10)

        async def dead_entry_lapsed() -> bool:
            (_, expiry, _), (_, live_expiry, _) = await entries()
            seconds, micros = await holding.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            assert live_expiry > now_ms, "the live waiter's entry lapsed"
            return expiry < now_ms

        await until(dead_entry_lapsed, "the dead waiter's entry lapsed", timeout=10)
        assert not live.done()
        await holder.release()
        # That release granted the lock to the live waiter's entry.
        info = await Lock(holding, name).info()
        assert info is not None
        assert (info.pid, info.task) == (os.getpid(), "live-waiter"), info
        lease = await asyncio.wait_for(live, 5)
        assert lease.fencing_token == info.fencing_token
        assert await entries() == []
        await lease.release()
    finally:
        if live is not None:
            live.cancel()
            await asyncio.gather(live, return_exceptions=True)
        await holding.aclose()
