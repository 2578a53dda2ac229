"""Where a lease's deadline comes from, and what an acquire does with a late answer.

A deadline counts from when the request was *sent* (never from when its reply came), minus
the safety margin, at acquire, at renewal and at `extend()`. The proxy runs in the test's
event loop and records when each request reached it: an upper bound, on the same clock, on
when the client sent it. Slow replies make a deadline counted from the reply visibly later.

Also here: a release that hands the lock to another process must not wake this process's
waiters; a fencing counter ahead of the server clock is honoured; an acquire answered
after the lease's validity is given back, not kept.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from aiolock import AcquireTimeoutError, EventKind, Lease, Lock, add_listener
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock._lua.lease import RENEW, RENEW_HOLDER
from aiolock._lua.lock import ACQUIRE
from aiolock._model.config import safety_margin

from ..conftest import CommandLog, make_client
from ..support.servers import RedisServer, server_us
from .test_network_faults import Proxied, proxied, until

__all__ = ("proxied",)  # the fixture, used by name

pytestmark = pytest.mark.real_only

SLOW = 0.25
"""Seconds every reply is held by the proxy."""

TTL = 3.0


def assert_counted_from_the_send(lease: Lease, sent_by: float, *, before: float) -> None:
    """`sent_by`: when the request reached the proxy; `before`: a time before it was sent."""
    margin = safety_margin(TTL)
    assert lease.deadline <= sent_by + TTL - margin, (
        "the deadline is later than the request's send time + ttl - margin: counted from the "
        "reply, or without the safety margin"
    )
    assert lease.deadline >= before + TTL - margin - 1e-9


async def test_an_acquired_lease_counts_from_the_send(proxied: Proxied, name: str) -> None:
    await (await Lock(proxied.client, f"{name}:warm", ttl=TTL).acquire()).release()
    proxied.proxy.delay_replies(SLOW)
    loop = asyncio.get_running_loop()
    before = loop.time()
    lease = await Lock(proxied.client, name, ttl=TTL).acquire()
    assert loop.time() - before >= SLOW
    (sent_by,) = proxied.proxy.arrived(ACQUIRE.sha.encode(), since=before)
    assert_counted_from_the_send(lease, sent_by, before=before)
    await lease.release()


async def test_extend_counts_from_the_send(proxied: Proxied, name: str) -> None:
    lease = await Lock(proxied.client, name, ttl=TTL, renew=False).acquire()
    await lease.extend()  # the script is loaded
    proxied.proxy.delay_replies(SLOW)
    before = asyncio.get_running_loop().time()
    await lease.extend()
    (sent_by,) = proxied.proxy.arrived(RENEW_HOLDER.sha.encode(), since=before)
    assert_counted_from_the_send(lease, sent_by, before=before)
    await lease.release()


async def test_a_renewal_counts_from_the_send(proxied: Proxied, name: str) -> None:
    lease = await Lock(proxied.client, name, ttl=TTL, renew_interval=0.5).acquire()
    renewed = asyncio.Event()
    remove = add_listener(lambda e: renewed.set() if e.kind is EventKind.RENEWED else None)
    try:
        await asyncio.wait_for(renewed.wait(), 5)  # the script is loaded
        renewed.clear()
        proxied.proxy.delay_replies(SLOW)
        before = asyncio.get_running_loop().time()
        await asyncio.wait_for(renewed.wait(), 5)
    finally:
        remove()
    sent_by = proxied.proxy.arrived(RENEW.sha.encode(), since=before)[0]
    assert_counted_from_the_send(lease, sent_by, before=before)
    await lease.release()


async def test_a_release_to_another_process_does_not_wake_this_ones_waiters(
    server_url: str, name: str
) -> None:
    """B waits first, A second; C's release grants the lock to B and says so on the
    channel. A hears it, and must go on sleeping: its turn comes after B's."""
    logs = [CommandLog(), CommandLog()]
    a, b = (make_client(server_url, log) for log in logs)
    c = make_client(server_url)
    keys = LockKeys.build("aiolock", name)
    try:
        holder = await Lock(c, name, ttl=30).acquire()
        first = asyncio.create_task(Lock(b, name, ttl=30).acquire())

        async def queued(count: int) -> bool:
            return int(await c.zcard(keys.queue)) == count

        await until(lambda: queued(1), "B queued", timeout=10)
        second = asyncio.create_task(Lock(a, name, ttl=30).acquire())
        await until(lambda: queued(2), "A queued", timeout=10)
        notifier = runtime_for(a).notifier
        await until(lambda: notifier.is_subscribed(keys.channel), "A subscribed", timeout=10)
        heard = notifier.messages_received
        mark = logs[0].mark()
        await holder.release()
        lease = await asyncio.wait_for(first, 10)
        await until(lambda: notifier.messages_received > heard, "A heard it", timeout=10)
        await asyncio.sleep(0.1)  # a woken waiter tries at once
        assert logs[0].since(mark) == {}, "A's waiter was woken by a release that was not its"
        await lease.release()
        await (await asyncio.wait_for(second, 10)).release()
    finally:
        await a.aclose()
        await b.aclose()
        await c.aclose()


@pytest.mark.parametrize("path", ["acquire", "grant"])
async def test_a_fencing_counter_ahead_of_the_clock_is_honoured(
    server: RedisServer, name: str, path: str
) -> None:
    """The server clock stepped back (or the counter came from a faster one): the next
    token is the counter + 1, never the clock's lower reading."""
    client = make_client(server.url)
    keys = LockKeys.build("aiolock", name)
    try:
        ahead = await server_us(client) + 10**12  # a counter 10**6 s ahead of the clock
        await client.hset(keys.lock, "fence", ahead)  # the state of a lock used before
        if path == "acquire":
            lease = await Lock(client, name, ttl=5).acquire()
        else:
            holder = await Lock(client, name, ttl=5).acquire()
            waiting = asyncio.create_task(Lock(client, name, ttl=5).acquire())

            async def queued() -> bool:
                return int(await client.zcard(keys.queue)) == 1

            await until(queued, "queued in Redis", timeout=10)
            await holder.release()
            lease = await asyncio.wait_for(waiting, 10)
            ahead = holder.fencing_token
        assert lease.fencing_token == ahead + 1
        await lease.release()
    finally:
        await client.aclose()


SPIN = """
-- Keep the server busy for ARGV[1] microseconds (reads only).
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000000 + tonumber(t[2])
repeat
  t = redis.call('TIME')
until tonumber(t[1]) * 1000000 + tonumber(t[2]) - start >= tonumber(ARGV[1])
return 1
"""


async def test_an_acquire_answered_after_the_validity_is_given_back(
    server_url: str, name: str
) -> None:
    """The event loop stalls between the acquire's send and the read of its reply, for
    longer than the lease would be valid: the reply must not become a lease."""
    logs = [CommandLog(), CommandLog()]
    client, busy = (make_client(server_url, log) for log in logs)
    try:
        lock = Lock(client, name, ttl=0.3)
        await (await lock.acquire()).release()  # scripts loaded, connection warm
        await busy.ping()

        # The server is kept busy for 50 ms, so the acquire's reply comes after the stall
        # has begun (the stall begins as soon as the request is seen written).
        async def spin() -> None:
            await busy.eval(SPIN, 0, 50_000)

        spinning = asyncio.create_task(spin())
        async with asyncio.timeout(5):
            while not logs[1].commands:
                await asyncio.sleep(0)
        mark = logs[0].mark()
        attempt = asyncio.create_task(lock.acquire(timeout=0))
        async with asyncio.timeout(5):
            while not logs[0].since(mark)["EVALSHA acquire"]:
                await asyncio.sleep(0)  # logged once written
        assert not attempt.done()
        time.sleep(0.5)  # past the lease's validity, before the reply is read
        with pytest.raises(AcquireTimeoutError):
            await asyncio.wait_for(attempt, 5)
        assert not await lock.locked(), "the late answer's key must be released at once"
        await spinning
    finally:
        await client.aclose()
        await busy.aclose()
