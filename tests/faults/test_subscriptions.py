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

from aiolock import BackendError, Lock
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock._lua.lock import ACQUIRE

from ..conftest import CommandLog, make_client
from ..support.waits import within
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


async def _refused_while(proxied: Proxied, name: str, *, trying: bool) -> None:
    """A waiter of a user of its own sleeps (the holder's key expires in 30 s), woken only
    by its pub/sub connection; the user loses the right to the name's channel, so the
    server closes that connection, and subscribing again is refused. The refusal comes
    while the waiter sleeps again after the lost connection's try (`trying` False), or
    while that try is on its way (True). Either way the waiter raises `BackendError` at
    once, not at its timeout (25 s)."""
    keys = LockKeys.build("aiolock", name)
    admin = proxied.direct
    await admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "waiter", "on", ">pw", "~*", "&*", "+@all"
    )
    log = CommandLog()
    limited = make_client(proxied.proxy.url, log, username="waiter", password="pw")
    holder = await Lock(admin, name, ttl=30).acquire()
    waiting = asyncio.create_task(Lock(limited, name, ttl=30).acquire(timeout=25))
    try:
        notifier = runtime_for(limited).notifier

        async def queued() -> bool:
            return notifier.is_subscribed(keys.channel) and bool(await admin.zcard(keys.queue))

        await until(queued, "the waiter subscribed and queued in Redis", timeout=10)
        queue = notifier.queue_for(keys.channel)
        assert queue is not None
        await until(lambda: queue.waiters[0].checks_within(60), "the waiter asleep", timeout=10)
        held = proxied.proxy.hold_requests(ACQUIRE.sha.encode() if trying else b"SUBSCRIBE")
        mark = log.mark()
        # (the server closes its pub/sub connection)
        await admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "waiter", "resetchannels"
        )
        await within(held.wait(), what="the step the refusal must come after, held")
        if trying:
            await until(lambda: queue.refusal is not None, "the refusal heard", timeout=10)
        else:
            await until(
                lambda: (
                    log.since(mark)["EVALSHA acquire"] == 1 and queue.waiters[0].checks_within(60)
                ),
                "the waiter's try after the lost connection answered, and asleep again",
                timeout=10,
            )
        await proxied.proxy.restore()
        with pytest.raises(BackendError) as caught:
            await within(waiting, what="the refusal told to the waiter")
        assert caught.value.operation == "subscribe"
    finally:
        await proxied.proxy.restore()
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await holder.release()
        await limited.aclose()


async def test_a_sleeping_waiter_is_told_at_once_that_its_subscription_was_refused(
    proxied: Proxied, name: str
) -> None:
    await _refused_while(proxied, name, trying=False)


async def test_a_waiter_refused_its_subscription_while_it_tries_is_told_after_its_try(
    proxied: Proxied, name: str
) -> None:
    await _refused_while(proxied, name, trying=True)
