"""Commands that tasks write in one pass of the event loop reach the server together.

A server asleep when a command arrives is woken for it: tasks that resume in one pass
(their replies read in one poll) and each write at once wake it once per command, and
that wake-up is most of the system time a lock cycle costs the client. aiolock holds the
commands written in a pass while other callbacks are ready, and writes them in one burst
behind them; a lone command is written at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio

from aiolock import Lock

from ..conftest import make_client
from ..support.waits import within

pytestmark = pytest.mark.real_only

TASKS = 8


@dataclass(frozen=True)
class Written:
    """One write on a connection: by which task (None: by a callback of the loop), and
    how many tasks had started their call by then."""

    task: asyncio.Task[Any] | None
    started: int
    commands: int


def spy_on_writes(client: redis.asyncio.Redis, started: list[int]) -> list[Written]:
    """Every write on `client`'s idle connections from now on (at their stream writers), as
    `Written`."""
    writes: list[Written] = []
    for connection in client.connection_pool._available_connections:
        writer: Any = connection._writer
        original: Callable[[bytes], None] = writer.write

        def write(data: bytes, original: Callable[[bytes], None] = original) -> None:
            commands = data.count(b"EVALSHA") + data.count(b"EVAL\r\n")
            writes.append(Written(asyncio.current_task(), len(started), commands))
            original(data)

        writer.write = write
    return writes


async def test_commands_written_in_one_pass_of_the_loop_reach_the_server_together(
    server_url: str, name: str
) -> None:
    """Eight tasks that start in one pass and each acquire a lock of their own: no command
    is written before the last of them has written its own, and all are written by one
    callback of the loop: the first on a connection of its own (no other call was under
    way when it was made), the others in one write on the connection they share.
    (On a loop that does not show its ready callbacks, uvloop, the first is written at
    once: no other call awaited its reply when it was made.)"""
    client = make_client(server_url)
    try:
        locks = [Lock(client, f"{name}:{i}", ttl=10) for i in range(TASKS)]

        async def cycle(lock: Lock) -> None:
            async with lock:
                pass

        await within(asyncio.gather(*map(cycle, locks)), what="a cycle of each task")
        started: list[int] = []
        writes = spy_on_writes(client, started)

        async def acquire(index: int) -> Any:
            started.append(index)
            return await locks[index].acquire(timeout=5)

        leases = await within(
            asyncio.gather(*(acquire(i) for i in range(TASKS))), what="every acquire"
        )
        # (On redis-py before 8, whose checkout pauses, the call that takes the connection
        # to share may write alone, a pass before the others.)
        assert sum(write.commands for write in writes) == TASKS, writes
        assert writes[-1].commands >= TASKS - 2 and len(writes) <= 3, writes
        held = writes
        if not hasattr(asyncio.get_running_loop(), "_ready"):
            assert writes[0].started == 1 and writes[0].task is not None, writes
            held = writes[1:]
        assert [write.started for write in held] == [TASKS] * len(held), (
            "a command was written before every task of the pass had written its own"
        )
        assert {write.task for write in held} == {None}, "written by a task, not the loop"
        for lease in leases:
            await lease.release()
    finally:
        await client.aclose()


async def test_a_lone_command_is_written_at_once(server_url: str, name: str) -> None:
    """A call made while nothing else is ready to run in the pass is written by its own
    task, before it waits for the reply: holding it would only cost a pass of the loop.
    So is the release at the end of an `async with` block (whose guard's last look, still
    queued, is called off when the block ends)."""
    client = make_client(server_url)
    try:
        lock = Lock(client, name, ttl=10)
        async with lock:
            pass
        writes = spy_on_writes(client, [])
        me = asyncio.current_task()
        lease = await within(lock.acquire(timeout=5), what="the acquire")
        await within(lease.release(), what="the release")
        async with lock:
            pass
        assert [write.task for write in writes] == [me] * 4, writes
    finally:
        await client.aclose()
