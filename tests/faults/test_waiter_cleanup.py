"""A cancelled acquire leaves nothing queued in Redis, whatever step it was cancelled at."""

from __future__ import annotations

import asyncio

import pytest

from aiolock import Lock
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys

from ..support.waits import cancelled
from .test_network_faults import Proxied, proxied, until

__all__ = ("proxied",)  # the fixture, used by name

pytestmark = pytest.mark.real_only


async def test_a_waiter_cancelled_while_joining_leaves_nothing_queued(
    proxied: Proxied, name: str
) -> None:
    """The last waiter of a process is cancelled while its subscription is being made again
    (after the pub/sub connection broke): the process's entry must leave the queue in Redis,
    or the next release grants the lock to nobody and another process waits a second."""
    keys = LockKeys.build("aiolock", name)
    holder = await Lock(proxied.direct, name, ttl=30).acquire()
    first = asyncio.create_task(Lock(proxied.client, name, ttl=30).acquire())
    second: asyncio.Task[object] | None = None
    try:
        notifier = runtime_for(proxied.client).notifier
        await until(lambda: notifier.is_subscribed(keys.channel), "first subscribed", timeout=10)

        async def queued_in_redis() -> bool:
            return int(await proxied.direct.zcard(keys.queue)) == 1

        await until(queued_in_redis, "the first waiter's process queued in Redis", timeout=10)
        subscribing = proxied.proxy.hold_requests(b"SUBSCRIBE")
        proxied.proxy.reset_all()  # the pub/sub connection breaks; its SUBSCRIBE is held
        await asyncio.wait_for(subscribing.wait(), 10)
        second = asyncio.create_task(Lock(proxied.client, name, ttl=30).acquire())
        await until(lambda: notifier.queue_length(keys.channel) == 2, "second joined", timeout=10)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        assert notifier.queue_length(keys.channel) == 1  # the second, still joining
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        assert notifier.queue_length(keys.channel) == 0
        assert await proxied.direct.zcard(keys.queue) == 0, "the cancelled waiter left its entry"
        assert await proxied.direct.hlen(keys.waiters) == 0
    finally:
        await proxied.proxy.restore()
        await cancelled(first, second)
        await holder.release()
