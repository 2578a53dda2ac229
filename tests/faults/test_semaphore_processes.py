"""`Semaphore` and `ReadWriteLock` across real processes: permits of a killed holder come
back, waiters in three processes are served in queue order, and a dead waiting writer stops
blocking readers.

The other processes are `tests/faults/holder.py` (`--limit`) and `tests/faults/permits.py`,
run with `sys.executable` against the test's own server; only processes the test started
are signalled, by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Self

import pytest
import redis.asyncio

from aiolock import ReadWriteLock, Semaphore
from aiolock._lua.layout import LockKeys
from aiolock._lua.rwlock import WRITER_MARK_MS
from aiolock._primitives.rwlock import _RWKeys

from ..conftest import make_client
from ..integration.test_semaphore import every_permit_free
from ..support.children import ended
from ..support.load import scaled
from ..support.servers import RedisServer, all_closed
from ..support.waits import eventually, within
from .test_process_faults import Holder

pytestmark = pytest.mark.real_only

ROOT = Path(__file__).resolve().parents[2]
LINE_TIMEOUT = 20.0
"""Hang guard for one line of a worker (its start includes importing redis and aiolock)."""


class Waiters:
    """A `tests.faults.permits` process: waiters for one semaphore, driven line by line."""

    def __init__(self, process: asyncio.subprocess.Process, index: int) -> None:
        self.process = process
        self.index = index
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, url: str, name: str, limit: int, index: int) -> Self:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.faults.permits",
            "--url",
            url,
            "--name",
            name,
            "--limit",
            str(limit),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        started = cls(process, index)
        assert (await started.next())["event"] == "ready"
        return started

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            event = json.loads(line)
            event["process"] = self.index
            await self.events.put(event)

    async def next(self) -> dict[str, Any]:
        event = await within(self.events.get(), what="a line of a waiter process",
                             timeout=LINE_TIMEOUT)  # fmt: skip
        assert event["event"] != "error", event
        return event

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")

    async def close(self) -> None:
        """Make sure the process is gone and every pipe is closed (its reader first)."""
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await ended(self.process)


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    async with all_closed([make_client(server.url)]) as (client,):
        yield client


@pytest.fixture
async def processes() -> AsyncIterator[list[Any]]:
    started: list[Any] = []
    try:
        yield started
    finally:
        for process in started:
            await process.close()


async def test_a_killed_holders_permit_returns_within_its_ttl(
    server: RedisServer, client: redis.asyncio.Redis, name: str, processes: list[Any]
) -> None:
    loop = asyncio.get_running_loop()
    ttl = 1.0
    semaphore = Semaphore(client, name, limit=2, ttl=10)
    mine = await semaphore.acquire()
    holder = await Holder.start(server.url, name, "--ttl", str(ttl), "--limit", "2")
    processes.append(holder)
    acquired = await holder.wait_for("acquired")
    assert acquired["slot"] == 1
    waiter = asyncio.create_task(semaphore.acquire())
    keys = LockKeys.build("aiolock", name, "sem:")

    async def queued() -> bool:
        return await client.zcard(keys.queue) == 1

    await eventually(queued, what="the waiter queued in Redis", interval=0.001)
    holder.kill()
    killed_at = loop.time()
    await holder.process.wait()
    permit = await within(waiter, what="the killed holder's permit")
    assert loop.time() <= killed_at + ttl + scaled(0.5)
    assert permit.slot == 1 and permit.fencing_token > acquired["fencing_token"]
    await permit.release()
    await mine.release()


def round_robin(arrivals: list[int]) -> list[int]:
    """The order the waiters (numbered in order of arrival; `arrivals[n]` is waiter n's
    process) are served in: the processes in the order they queued, one permit at a time
    each, a process going to the back of the queue after each; within a process, its
    waiters in the order they came."""
    waiting: dict[int, deque[int]] = {}
    for number, process in enumerate(arrivals):
        waiting.setdefault(process, deque()).append(number)
    turn = deque(waiting)
    order = []
    while turn:
        process = turn.popleft()
        order.append(waiting[process].popleft())
        if waiting[process]:
            turn.append(process)
    return order


async def test_waiters_in_three_processes_are_served_in_queue_order(
    server: RedisServer, client: redis.asyncio.Redis, name: str, processes: list[Any]
) -> None:
    """20 waiters in 3 processes, arriving interleaved, each releasing as soon as it holds
    its permit: they are served round the queue in Redis (each process in the order it
    queued, to the back after each permit), each process's own in arrival order, and no
    permit goes unused (each one-at-a-time hand-off is one release)."""
    limit = 2
    workers = [await Waiters.start(server.url, name, limit, index) for index in range(3)]
    processes.extend(workers)
    semaphore = Semaphore(client, name, limit=limit, ttl=10)
    held = [await semaphore.acquire() for _ in range(limit)]
    keys = LockKeys.build("aiolock", name, "sem:")
    arrivals = [0, 1, 0, 2, 1, 1, 0, 2, 2, 0, 1, 2, 0, 0, 1, 2, 1, 0, 2, 1]
    seen: set[int] = set()
    for number, process in enumerate(arrivals):
        worker = workers[process]
        worker.send(f"wait {number}")
        joined = await worker.next()
        assert joined["event"] == "joined" and joined["waiter"] == str(number), joined
        if process not in seen:
            seen.add(process)

            async def in_line(count: int = len(seen)) -> bool:
                return await client.zcard(keys.queue) == count

            await eventually(in_line, what=f"process {process} queued in Redis", interval=0.001)
    expected = round_robin(arrivals)

    # One permit stays held here: the waiters hand the other one down the line.
    await held.pop().release()
    served: list[tuple[int, int]] = []  # (fencing token, waiter)
    merged: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def forward(worker: Waiters) -> None:
        while True:
            await merged.put(await worker.next())

    forwarders = [asyncio.create_task(forward(worker)) for worker in workers]
    try:
        while len(served) < len(arrivals):
            event = await within(merged.get(), what=f"waiter {len(served) + 1} served",
                                 timeout=LINE_TIMEOUT)  # fmt: skip
            if event["event"] == "acquired":
                served.append((event["fencing_token"], int(event["waiter"])))
                workers[event["process"]].send(f"release {event['waiter']}")
    finally:
        for forwarder in forwarders:
            forwarder.cancel()
    assert [number for _, number in sorted(served)] == expected
    assert [number for _, number in served] == expected, "entered in token order"
    for worker in workers:
        worker.send("exit")
    for worker in workers:
        code = await within(worker.process.wait(), what="a waiter process to exit")
        assert code == 0
    await held.pop().release()
    await every_permit_free(semaphore)


async def test_a_waiting_writer_whose_process_died_stops_blocking_readers(
    server: RedisServer, client: redis.asyncio.Redis, name: str, processes: list[Any]
) -> None:
    """A writer process waits behind a reader (new readers are refused meanwhile), then is
    killed: within about WRITER_MARK_MS, readers get in again."""
    loop = asyncio.get_running_loop()
    rw = ReadWriteLock(client, name, ttl=10)
    reading = await rw.read().acquire()
    writer = await Holder.start(server.url, name, "--rw", "write", "--ttl", "10")
    processes.append(writer)
    queue = _RWKeys.build("aiolock", name).writers[0]

    async def writer_waits() -> bool:
        return await client.zcard(queue) == 1

    await eventually(writer_waits, what="the writer process queued", interval=0.001)
    assert await rw.read().try_acquire() is None, "a reader passed the waiting writer"
    writer.kill()
    killed_at = loop.time()
    await writer.process.wait()
    other_client = make_client(server.url)  # another process's reader
    try:
        lease = await ReadWriteLock(other_client, name, ttl=10).read().acquire(timeout=5)
        waited = loop.time() - killed_at
        assert waited <= WRITER_MARK_MS / 1000 + 0.5, f"readers blocked {waited:.3f}s"
        await lease.release()
    finally:
        await other_client.aclose()
    await reading.release()


async def test_a_killed_holders_lease_of_several_permits_returns_whole_within_its_ttl(
    server: RedisServer, client: redis.asyncio.Redis, name: str, processes: list[Any]
) -> None:
    """A process holding 3 of 4 permits as one lease is killed: its 3 permits come back
    together when its lease expires, and a request for 3 waiting here gets them."""
    loop = asyncio.get_running_loop()
    ttl = 1.0
    semaphore = Semaphore(client, name, limit=4, ttl=10)
    holder = await Holder.start(
        server.url, name, "--ttl", str(ttl), "--limit", "4", "--permits", "3"
    )
    processes.append(holder)
    acquired = await holder.wait_for("acquired")
    assert acquired["slot"] == 0
    assert await semaphore.try_acquire(permits=2) is None
    waiter = asyncio.create_task(semaphore.acquire(permits=3, timeout=30))

    async def barrier_up() -> bool:
        return bool(await client.hexists(LockKeys.build("aiolock", name, "sem:").lock, "w"))

    await eventually(barrier_up, what="the request for 3 permits waiting", interval=0.001)
    holder.kill()
    killed_at = loop.time()
    await holder.process.wait()
    lease = await within(waiter, what="the killed holder's permits")
    assert loop.time() <= killed_at + ttl + 1.0
    assert lease.permits == 3 and lease.fencing_token > acquired["fencing_token"]
    assert (await semaphore.info()).held == 3
    await lease.release()
