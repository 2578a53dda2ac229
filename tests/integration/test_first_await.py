"""A lease lost during a stall raises in the body at its first await after the stall.

The loss is declared when the event loop runs again after the stall (its deadline timer).
The body's first await after the stall must then raise, also when what it awaits is
already complete when the loss lands: anyio's cancel scope does not cancel a task whose
awaited future is done, and asyncio runs a task's ready step before the timers that fell
due. Code between the stall and that await runs (nothing can stop it: fencing covers it).

Each scenario is made deterministic by a loop stall (`time.sleep` in the loop) past the
deadline of a lease that is not renewed (nothing is in doubt when the loop runs again).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest
import redis.asyncio

from aiolock import Election, LeaseLostError, Lock, MultiLock, ReadWriteLock, Redlock, Semaphore

from ..support.servers import (
    RedisServer,
    ServerBinary,
    clients_of,
    independent_servers,
    quorum_calls_ended,
)

pytestmark = pytest.mark.real_only

TTL = 0.3
STALL = 0.6
"""Past the lease's deadline (its ttl minus the margin), with room to spare."""

ELECTION_TTL = 1.0
"""An election's terms are renewed: first 0.9 s after the term began, so that no renewal is
in flight when the stall (`ELECTION_STALL`) begins, just after."""
ELECTION_STALL = 1.3

KINDS = ("lock", "semaphore", "read", "write", "redlock", "election", "multilock")


@pytest.fixture(scope="module")
def servers(binaries: list[ServerBinary]) -> Iterator[list[RedisServer]]:
    """A Redlock's three nodes."""
    with independent_servers(binaries[0], 3) as started:
        yield started


@contextlib.asynccontextmanager
async def guarded(
    kind: str, client: redis.asyncio.Redis, servers: list[RedisServer], name: str
) -> AsyncIterator[Any]:
    """What `async with` guards a body with, for `kind`: a lease not renewed, ttl `TTL`."""
    options: dict[str, Any] = {"ttl": TTL, "renew": False}
    if kind == "lock":
        yield await Lock(client, name, **options).acquire()
    elif kind == "semaphore":
        yield await Semaphore(client, name, limit=2, **options).acquire()
    elif kind in ("read", "write"):
        rw = ReadWriteLock(client, name, **options)
        yield await (rw.read() if kind == "read" else rw.write()).acquire()
    elif kind == "multilock":
        yield await MultiLock(client, [f"{name}:a", f"{name}:b"], **options).acquire()
    elif kind == "redlock":
        async with clients_of(servers) as nodes:
            yield await Redlock(nodes, name, **options).acquire()
            # The release a majority decided goes on to the last node in the background,
            # on a connection of its own (slow on a loaded machine): it ends first.
            await quorum_calls_ended(nodes)
    else:  # an election's terms are always renewed: late enough that none is in flight
        terms = Election(client, name, ttl=ELECTION_TTL, renew_interval=0.9).campaign()
        async with contextlib.aclosing(terms):
            yield await anext(terms)


def completed_future() -> Callable[[], Awaitable[None]]:
    """A future that a callback completes as soon as the loop runs again after the stall
    (a reply that arrived meanwhile): done when the loss lands."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    loop.call_soon(_complete, future)

    async def wait() -> None:
        await future

    return wait


def _complete(future: asyncio.Future[None]) -> None:
    if not future.done():  # (cancelled meanwhile: the wait was given up)
        future.set_result(None)


def ready_step() -> Callable[[], Awaitable[None]]:
    """A `sleep(0)`: the task is ready again at once, its step queued before the timers."""

    async def wait() -> None:
        await asyncio.sleep(0)

    return wait


SCENARIOS = {"completed-future": completed_future, "ready-step": ready_step}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("kind", KINDS)
async def test_a_loss_during_a_stall_raises_at_the_first_await_after_it(
    client: redis.asyncio.Redis,
    servers: list[RedisServer],
    name: str,
    kind: str,
    scenario: str,
) -> None:
    await client.ping()  # a connection open: the acquire is answered well within the ttl
    steps: list[str] = []
    async with guarded(kind, client, servers, name) as lease:
        with pytest.raises(LeaseLostError) as info:
            async with asyncio.timeout(10), lease:
                wait = SCENARIOS[scenario]()
                time.sleep(ELECTION_STALL if kind == "election" else STALL)  # past the deadline
                steps.append("stalled")  # runs: nothing can stop it
                await wait()  # the first await after the stall
                steps.append("one more step")  # must not run
                await asyncio.sleep(10)
    assert steps == ["stalled"]
    assert info.value.body_completed is False
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_body_inside_a_shielded_scope_is_not_cancelled_until_the_shield_ends(
    client: redis.asyncio.Redis, name: str
) -> None:
    """The guard never cancels natively where the user shielded the body: the loss
    lands once the shielded part is done."""
    await client.ping()
    steps: list[str] = []
    lease = await Lock(client, name, ttl=TTL, renew=False).acquire()
    with pytest.raises(LeaseLostError) as info:
        async with asyncio.timeout(10), lease:
            with anyio.CancelScope(shield=True):
                wait = completed_future()
                time.sleep(STALL)
                await wait()
                await asyncio.sleep(0)
                steps.append("shielded")
            steps.append("after the shield")  # runs: no await since the shield ended
            await asyncio.sleep(10)
    assert steps == ["shielded", "after the shield"]
    assert info.value.body_completed is False
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
