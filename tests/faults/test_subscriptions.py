"""Waiters that queue while the process's pub/sub connection is still being opened.

The first waiter of a process opens its pub/sub connection and subscribes every queue
waiting then. A waiter that queues during that handshake finds no connection to subscribe
on yet and leaves its subscription to the listener: it must be subscribed as soon as the
connection is open, not left unsubscribed (it would wait its subscription's timeout, its
grants would lapse unheard, and it would sleep until the holder's key expires).
"""

from __future__ import annotations

import asyncio

import pytest

from aiolock import Lock
from aiolock._layout import LockKeys
from aiolock._runtime import runtime_for

from .test_network_faults import Proxied, proxied, until

__all__ = ("proxied",)  # the fixture, used by name

pytestmark = pytest.mark.real_only

HANDSHAKE = 1.5
"""How long the proxy holds each new connection before connecting it to the server."""


async def test_a_waiter_queued_while_the_connection_opens_is_subscribed_with_it(
    proxied: Proxied, name: str
) -> None:
    names = [f"{name}:a", f"{name}:b"]
    channels = [LockKeys.build("aiolock", each).channel for each in names]

    async def cycle(lock: str) -> None:
        async with Lock(proxied.client, lock, ttl=30):
            await asyncio.sleep(0.01)

    # Two command connections open already: only the pub/sub connection is new.
    await asyncio.gather(cycle(f"{name}:warm:1"), cycle(f"{name}:warm:2"))
    holders = [await Lock(proxied.direct, each, ttl=30).acquire() for each in names]
    notifier = runtime_for(proxied.client).notifier
    proxied.proxy.delay_connections(HANDSHAKE)
    waiting = [asyncio.create_task(Lock(proxied.client, names[0], ttl=30).acquire())]
    try:
        await until(lambda: notifier.queue_length(channels[0]) == 1, "queued", timeout=5)
        waiting.append(asyncio.create_task(Lock(proxied.client, names[1], ttl=30).acquire()))
        await until(lambda: notifier.queue_length(channels[1]) == 1, "queued", timeout=5)
        assert not notifier.is_subscribed(channels[0]), "premise: the connection still opens"
        for channel in channels:
            await until(
                lambda channel=channel: notifier.is_subscribed(channel),  # type: ignore[misc]
                f"{channel} subscribed",
                timeout=HANDSHAKE + 4,
            )
        # Each release reaches its waiter at once, not once the holder's key would expire.
        for holder, task in zip(reversed(holders), reversed(waiting), strict=True):
            await holder.release()
            lease = await asyncio.wait_for(task, 5)
            await lease.release()
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for holder in holders:
            await holder.release()


async def test_a_watch_made_while_the_connection_opens_is_subscribed_with_it(
    proxied: Proxied, name: str
) -> None:
    """As for waiters, for the watches an election's followers keep."""
    async with Lock(proxied.client, f"{name}:warm", ttl=30):
        pass
    notifier = runtime_for(proxied.client).notifier
    accepted = proxied.proxy.connections_accepted
    proxied.proxy.delay_connections(HANDSHAKE)
    first = notifier.watch(f"{name}:first")
    second = None
    try:
        await until(lambda: proxied.proxy.connections_accepted > accepted, "connecting", timeout=5)
        second = notifier.watch(f"{name}:second")
        assert not first.subscribed.is_set(), "premise: the connection still opens"
        await asyncio.wait_for(notifier.watch_ready(second, timeout=HANDSHAKE + 4), 10)
        assert second.subscribed.is_set(), "the second watch was never subscribed"
        await asyncio.wait_for(notifier.watch_ready(first, timeout=HANDSHAKE + 4), 10)
        assert first.subscribed.is_set()
    finally:
        notifier.unwatch(first)
        if second is not None:
            notifier.unwatch(second)
