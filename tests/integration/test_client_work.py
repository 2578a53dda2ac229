"""What the client makes per operation, counted exactly: a grant from another process's
release is taken with one future of the grantee's own (what it waits for: the renewal to
the full ttl written, or its answer where writes cannot be seen), not one for each; the
listener reads it without a pass over lingering channels when none lingers."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
import redis.asyncio

from aiolock import Lock
from aiolock._engine.lease_issuing import LeaseIssuing
from aiolock._engine.notifier import Notifier
from aiolock._engine.runtime import runtime_for

from .test_stalls import pair, queued

pytestmark = pytest.mark.real_only

__all__ = ("pair",)  # the fixture, used by name


async def test_taking_another_processs_grant_makes_one_future_of_its_own(
    pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, Any],
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b, _ = pair
    loop = asyncio.get_running_loop()
    made: list[str] = []
    create_future = loop.create_future

    def counted_future() -> asyncio.Future[Any]:
        made.append(sys._getframe(1).f_code.co_name)
        return create_future()

    taken: list[list[str]] = []
    take_grant = LeaseIssuing.take_grant

    async def counting(self: Any, *args: Any) -> None:
        monkeypatch.setattr(loop, "create_future", counted_future)
        try:
            await take_grant(self, *args)
        finally:
            monkeypatch.undo()
        taken.append(list(made))

    # A grant heard of late (a loaded machine) is claimed by an acquire instead of taken:
    # then the hand-off is made again, at most 3 times in all.
    for _ in range(3):
        monkeypatch.setattr(LeaseIssuing, "take_grant", counting)
        holder = await Lock(a, name, ttl=30).acquire()
        waiting = asyncio.create_task(Lock(b, name, ttl=30).acquire())
        await queued(a, name, waiter=b)
        await holder.release()
        lease = await asyncio.wait_for(waiting, 10)
        monkeypatch.undo()
        await lease.release()
        if taken:
            break
    assert taken, "no grant was taken in 3 hand-offs"
    assert taken[0].count("_renew_granted") == 1, taken[0]


async def test_the_listener_reads_a_grant_without_an_idle_channel_pass(
    pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, Any],
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No channel lingers (no waiter of `b` has left one): the messages up to the grant are
    read and dispatched with no pass over the lingering channels after each."""
    a, b, _ = pair
    passes = 0
    drop = Notifier._drop_idle_channels

    async def counted(self: Notifier, now: float) -> None:
        nonlocal passes
        passes += 1
        await drop(self, now)

    holder = await Lock(a, name, ttl=30).acquire()
    waiting = asyncio.create_task(Lock(b, name, ttl=30).acquire())
    await queued(a, name, waiter=b)
    monkeypatch.setattr(Notifier, "_drop_idle_channels", counted)
    heard = runtime_for(b).notifier.messages_received
    await holder.release()
    lease = await asyncio.wait_for(waiting, 10)
    monkeypatch.undo()
    await lease.release()
    assert runtime_for(b).notifier.messages_received > heard, "the grant came as a message"
    assert passes == 0
