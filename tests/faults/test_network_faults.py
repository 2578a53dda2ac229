"""Network faults between a client and Redis, made by `FaultProxy` (tests/deployments/proxy.py).

Slow replies, a partition (blackhole), connections reset, connections refused. The client
under test talks to the server through the proxy; whatever plays "another process" talks
to the server directly. What each test shows is listed in docs/guarantees.md ("The
network").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions
from redis.asyncio.connection import Connection

from aiolock import AcquireTimeoutError, BackendError, Lease, LeaseLostError, Lock, LossReason
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys

from ..conftest import CommandLog, make_client
from ..deployments.proxy import FaultProxy
from ..support.load import loop_lag, scaled
from ..support.servers import RedisServer
from ..support.waits import eventually, until_cancelled, within

pytestmark = pytest.mark.real_only

SCHEDULING_BOUND = 0.3
"""Event-loop scheduling delay allowed between a lease's deadline and the body's cancellation."""
TIMER_RESOLUTION = 0.001
"""How early a timer may fire by the loop's clock: uvloop's timers and clock are
millisecond-granular (a deadline of 5946.5830000000005 fires at 5946.583)."""

RELEASE_TIMEOUT_OF_1S_TTL = 1.0
"""How long a release waits for Redis when the ttl is 1 s (min(max(ttl, 0.5), 5))."""


async def until(check: Callable[[], bool | Awaitable[bool]], what: str, *, timeout: float) -> None:
    """Wait until `check()` holds, polling; fail (not hang) after `timeout` seconds."""
    await eventually(check, what=what, timeout=timeout, interval=0.005)


@dataclass
class Proxied:
    """A proxy in front of the test's server, a client through it, and one around it."""

    proxy: FaultProxy
    client: redis.asyncio.Redis
    direct: redis.asyncio.Redis


@pytest.fixture
async def proxied(server: RedisServer, commands: CommandLog) -> AsyncIterator[Proxied]:
    proxy = await FaultProxy(server.port).start()
    client = make_client(proxy.url, commands)
    direct = make_client(server.url)
    try:
        yield Proxied(proxy, client, direct)
    finally:
        await proxy.restore()  # held bytes flow, so closing the client does not wait on them
        await client.aclose()
        await direct.aclose()
        await proxy.aclose()


# --------------------------------------------------------------------------- slow replies
async def test_replies_slower_than_the_renewal_bound_lose_the_lease_by_its_deadline(
    proxied: Proxied, name: str, commands: CommandLog
) -> None:
    """Every reply takes 2 s, twice the ttl: renewals are sent and retried, none is confirmed
    in time, the body is cancelled at the deadline, and `async with` raises (never hangs)."""
    loop = asyncio.get_running_loop()
    ttl = 1.0
    lock = Lock(proxied.client, name, ttl=ttl)
    lost_at: float | None = None
    slowed_at = 0.0
    mark = accepted = 0
    with pytest.raises(LeaseLostError) as info:
        async with lock as lease:
            first_deadline = lease.deadline
            # Once renewing works (its connection is open), every reply becomes slow.
            await until(lambda: lease.deadline > first_deadline, "a first renewal", timeout=5)
            mark = commands.mark()
            accepted = proxied.proxy.connections_accepted
            proxied.proxy.delay_replies(2 * ttl)
            slowed_at = loop.time()
            try:
                await until_cancelled(what="the loss at the lease's deadline")
            except asyncio.CancelledError:
                lost_at = loop.time()
                raise
    raised_at = loop.time()
    assert info.value.reason is LossReason.DEADLINE
    assert lease.lost and lease.loss_reason is LossReason.DEADLINE
    assert isinstance(info.value.__cause__, BackendError), "the failed renewal is the cause"
    # A renewal was sent; when it timed out its connection was dropped, and the retry had
    # to open a new one (whose handshake is just as slow).
    assert commands.since(mark)["EVALSHA renew"] >= 1
    assert proxied.proxy.connections_accepted > accepted, "renewals are retried"
    assert lost_at is not None
    # No reply arrived after the slowdown, so nothing moved the deadline past it.
    assert lease.deadline <= slowed_at + ttl
    assert lease.deadline - TIMER_RESOLUTION <= lost_at <= lease.deadline + SCHEDULING_BOUND
    # The release after the loss waits for its own timeout at most, not for the slow reply.
    assert raised_at <= lost_at + RELEASE_TIMEOUT_OF_1S_TTL + scaled(0.5)
    # The release itself reached Redis (only replies are slow): the lock is free again.
    await until(lambda: _free(proxied.direct, lock), "the release was applied", timeout=5)


async def _free(client: redis.asyncio.Redis, lock: Lock) -> bool:
    return not await client.exists(lock.key)


# --------------------------------------------------------------------------- blackhole
ACQUIRE_TIMEOUT = 2.0
ABORT_TIMEOUT = 1.0
"""aiolock/_engine/release.py `ABORT_TIMEOUT`: how long a failed acquire waits for its cleanup."""
MIN_CLEANUP = 0.1
"""aiolock/_engine/release.py `MIN_CLEANUP`: the cleanup an acquire whose time is up waits for."""


async def test_blackholed_acquire_raises_backend_error(proxied: Proxied, name: str) -> None:
    """Redis never answers: a timed acquire reports "broken", not "busy", and does not hang.

    Today the bound is the timeout plus the cleanup of the attempt (which cannot reach Redis
    either); see the next test for the bound the timeout promises.
    """
    loop = asyncio.get_running_loop()
    proxied.proxy.blackhole()
    started = loop.time()
    with pytest.raises(BackendError) as info:
        async with asyncio.timeout(10):  # a hang guard
            await Lock(proxied.client, name, ttl=30).acquire(timeout=ACQUIRE_TIMEOUT)
    elapsed = loop.time() - started
    assert info.type is BackendError  # not AcquireTimeoutError
    assert info.value.operation == "acquire"
    assert ACQUIRE_TIMEOUT <= elapsed <= ACQUIRE_TIMEOUT + ABORT_TIMEOUT + scaled(0.5)
    await proxied.proxy.restore()
    assert not await proxied.direct.exists(Lock(proxied.direct, name).key)


async def test_blackholed_acquire_raises_within_its_timeout(proxied: Proxied, name: str) -> None:
    loop = asyncio.get_running_loop()
    proxied.proxy.blackhole()
    timeout = 1.0
    started = loop.time()
    async with loop_lag() as lag:
        with pytest.raises(BackendError):
            async with asyncio.timeout(10):  # a hang guard
                await Lock(proxied.client, name, ttl=30).acquire(timeout=timeout)
    # The promise: the timeout and the moment its cleanup is given, plus what a busy
    # machine delays the loop by: a scheduling slack (it has taken 0.4 s with two CI lanes
    # side by side), and the time the loop was kept from running, as measured (2.4 s in
    # all once, under a load average of 4.6 on two cores).
    assert loop.time() - started <= timeout + MIN_CLEANUP + scaled(0.3) + lag.total


async def test_a_blackhole_shorter_than_the_validity_is_survived(
    proxied: Proxied, name: str
) -> None:
    """A 0.2 s partition with a 1 s ttl: renewals are late, not lost, and the lease holds."""
    loop = asyncio.get_running_loop()
    ttl = 1.0
    async with Lock(proxied.client, name, ttl=ttl) as lease:
        deadline_before = lease.deadline
        proxied.proxy.blackhole()
        await asyncio.sleep(0.2)  # the partition lasts this long
        await proxied.proxy.restore()
        # Still held after the deadline it had when the partition began: renewed meanwhile.
        await until(
            lambda: lease.lost or loop.time() > deadline_before + 0.05,
            "the deadline the lease had when the partition began has passed",
            timeout=5,
        )
        assert not lease.lost, lease.loss_reason
        assert lease.held
    assert lease.released and not lease.lost


# --------------------------------------------------------------------------- resets
async def test_reset_connections_mid_hold_are_reopened_and_the_lease_survives(
    proxied: Proxied, name: str, commands: CommandLog
) -> None:
    loop = asyncio.get_running_loop()
    ttl = 1.0
    lock = Lock(proxied.client, name, ttl=ttl)
    async with lock as lease:
        await until(lambda: proxied.proxy.open_connections >= 2, "renewal connection", timeout=5)
        accepted = proxied.proxy.connections_accepted
        mark = commands.mark()
        deadline_before = lease.deadline
        assert proxied.proxy.reset_all() >= 2  # the user's pool and aiolock's renewal connection
        # Still held after the deadline it had at the reset: a renewal got through since.
        await until(
            lambda: lease.lost or loop.time() > deadline_before + 0.05,
            "the deadline the lease had at the reset has passed",
            timeout=5,
        )
        assert not lease.lost, lease.loss_reason
        assert commands.since(mark)["EVALSHA renew"] >= 1
        assert proxied.proxy.connections_accepted > accepted, "renewal reconnected"
        info = await lock.info()  # the user's pooled connection was reset too
        assert info is not None and info.fencing_token == lease.fencing_token
    assert lease.released and not lease.lost
    assert not await lock.locked()


class _Subclass(Connection):
    """A connection class aiolock does not send on directly: through `execute_command`."""


@pytest.mark.parametrize("send", ["direct", "execute_command"])
async def test_a_reset_pooled_connection_is_replaced_for_the_next_call(
    server: RedisServer, name: str, send: str
) -> None:
    """Every connection of the pool is reset while idle: the next lock call is sent again on
    a new connection, and neither fails nor raises anything but aiolock's errors. (On
    uvloop, the write on the reset connection raises RuntimeError, not OSError.)"""
    proxy = await FaultProxy(server.port).start()
    kwargs: dict[str, Any] = {} if send == "direct" else {"connection_class": _Subclass}
    client = make_client(proxy.url, **kwargs)
    try:
        lock = Lock(client, name, ttl=5)
        assert not await lock.locked()  # the pool now holds a connection
        for operation in ("acquire", "info", "release"):
            assert proxy.reset_all() >= 1, "the pool holds a connection"
            await until(lambda: proxy.open_connections == 0, "the reset links are gone", timeout=5)
            if operation == "acquire":
                lease = await lock.acquire(timeout=5)
            elif operation == "info":
                info = await lock.info()
                assert info is not None and info.fencing_token == lease.fencing_token
            else:
                await lease.release()
        assert lease.released and not lease.lost
        assert not await lock.locked()
    finally:
        await client.aclose()
        await proxy.aclose()


async def test_refused_connections_lose_the_lease_by_deadline_and_fail_acquires_fast(
    proxied: Proxied, name: str
) -> None:
    """Every connection reset and no new one accepted: renewals cannot be sent, the lease is
    lost at its deadline; an acquire meanwhile is "broken" (BackendError), not "busy"."""
    loop = asyncio.get_running_loop()
    ttl = 0.5
    lock = Lock(proxied.client, name, ttl=ttl)
    with pytest.raises(LeaseLostError) as info:
        async with lock as lease:
            proxied.proxy.refuse_new()
            proxied.proxy.reset_all()
            with pytest.raises(BackendError) as acquire_info:
                await Lock(proxied.client, f"{name}:other", ttl=ttl).acquire(timeout=30)
            assert acquire_info.type is BackendError
            await until_cancelled(what="the loss at the lease's deadline")
    lost_at = loop.time()
    assert info.value.reason is LossReason.DEADLINE
    assert lease.lost
    # The release failed too (refused): the exit waited at most for the release timeout.
    assert lost_at <= lease.deadline + SCHEDULING_BOUND + 1.0
    await proxied.proxy.restore()
    # The key was never released; it expires by itself, then the lock works again.
    async with Lock(proxied.client, name, ttl=ttl, timeout=5) as after:
        assert after.fencing_token > lease.fencing_token


# --------------------------------------------------------------------------- pub/sub resets
class ReplyLog:
    """The replies read by every connection of one client (the pub/sub one included)."""

    def __init__(self) -> None:
        self.replies: list[Any] = []

    def connection_class(self) -> type[Connection]:
        log = self

        class RecordingConnection(Connection):
            async def read_response(self, *args: Any, **kwargs: Any) -> Any:
                reply = await super().read_response(*args, **kwargs)
                log.replies.append(reply)
                return reply

        return RecordingConnection

    def mark(self) -> int:
        return len(self.replies)

    def held_replies_since(self, mark: int) -> int:
        """ACQUIRE replies answering "held by someone else" ([0, pttl, the holder...])
        since `mark`."""
        return sum(
            1
            for reply in self.replies[mark:]
            if isinstance(reply, list) and len(reply) >= 7 and reply[0] == 0
        )


def channel_of(name: str) -> str:
    return LockKeys.build("aiolock", name).channel


async def test_a_release_during_a_pubsub_reset_still_wakes_the_waiter(
    proxied: Proxied, name: str
) -> None:
    """Every connection of the waiter's client is reset, and the holder releases at once:
    the notification is lost with the connection, yet the waiter acquires well before the
    holder's key (30 s) would have expired."""
    loop = asyncio.get_running_loop()
    holder = await Lock(proxied.direct, name, ttl=30).acquire()
    waiting: asyncio.Task[Lease] | None = None
    try:
        waiting = asyncio.create_task(Lock(proxied.client, name, ttl=30).acquire(timeout=60))
        notifier = runtime_for(proxied.client).notifier
        await until(
            lambda: notifier.is_subscribed(channel_of(name)), "waiter subscribed", timeout=10
        )
        assert proxied.proxy.reset_all() >= 2  # the pub/sub and the pooled connection
        await holder.release()
        released_at = loop.time()
        lease = await asyncio.wait_for(waiting, 10)  # a hang guard; 30 s would be the ttl
        assert loop.time() - released_at < 5
        assert lease.fencing_token > holder.fencing_token
        await lease.release()
    finally:
        await holder.release()  # a no-op once released
        if waiting is not None and not waiting.done():
            waiting.cancel()
        if waiting is not None:
            await asyncio.gather(waiting, return_exceptions=True)


@pytest.fixture
async def recorded(server: RedisServer) -> AsyncIterator[tuple[Proxied, ReplyLog]]:
    proxy = await FaultProxy(server.port).start()
    replies = ReplyLog()
    client = redis.asyncio.Redis.from_url(proxy.url, connection_class=replies.connection_class())
    direct = make_client(server.url)
    try:
        yield Proxied(proxy, client, direct), replies
    finally:
        await proxy.restore()
        await client.aclose()
        await direct.aclose()
        await proxy.aclose()


async def test_a_release_between_the_retry_and_the_resubscription_wakes_the_waiter(
    recorded: tuple[Proxied, ReplyLog], name: str
) -> None:
    """The race pinned down: the pub/sub connection breaks, the woken head tries ("held"),
    then the holder releases before the subscription is re-established. Nothing announces
    that release to the new subscription: the reconnect itself must wake the head to try
    again, or it sleeps until the holder's key would have expired (30 s)."""
    proxied, replies = recorded
    loop = asyncio.get_running_loop()
    holder = await Lock(proxied.direct, name, ttl=30).acquire()
    waiting: asyncio.Task[Lease] | None = None
    try:
        waiting = asyncio.create_task(Lock(proxied.client, name, ttl=30).acquire(timeout=60))
        notifier = runtime_for(proxied.client).notifier
        await until(
            lambda: notifier.is_subscribed(channel_of(name)), "waiter subscribed", timeout=10
        )
        # Tried before subscribing and once subscribed (a release may have come in between).
        await until(lambda: replies.held_replies_since(0) >= 2, "the waiter parked", timeout=10)
        subscribing = proxied.proxy.hold_requests(b"SUBSCRIBE")
        mark = replies.mark()
        proxied.proxy.reset_all()
        # The head was woken by the broken connection and tried: Redis said "held".
        await until(lambda: replies.held_replies_since(mark) >= 1, "the head retried", timeout=10)
        # The listener is reconnecting; its SUBSCRIBE is held by the proxy.
        await asyncio.wait_for(subscribing.wait(), 10)
        await holder.release()  # announced to nobody: no subscription exists now
        released_at = loop.time()
        await proxied.proxy.restore()  # the SUBSCRIBE goes through
        await until(
            lambda: notifier.is_subscribed(channel_of(name)) or waiting.done(),
            "waiter re-subscribed (or already woken by it)",
            timeout=10,
        )
        try:
            lease = await asyncio.wait_for(waiting, 3)  # 30 s would be the holder's ttl
        except TimeoutError:
            pytest.fail(
                "the lock was free and the waiter re-subscribed, yet it did not take the lock "
                "within 3 s: a release between its retry and its re-subscription is noticed "
                "only when the holder's ttl (30 s) would have run out"
            )
        assert loop.time() - released_at < 5
        await lease.release()
    finally:
        await holder.release()  # a no-op once released
        if waiting is not None and not waiting.done():
            waiting.cancel()
        if waiting is not None:
            await asyncio.gather(waiting, return_exceptions=True)


async def test_a_lingering_subscription_of_a_dropped_client_ends_cleanly(
    proxied: Proxied, name: str
) -> None:
    """The last waiter is gone, the subscription lingers (1 s), the client is closed and
    dropped, then the pub/sub connection breaks: the listener must just end."""
    client = make_client(proxied.proxy.url)
    holder = await Lock(proxied.direct, name, ttl=5).acquire()
    waiting = asyncio.create_task(Lock(client, name, ttl=5, renew=False).acquire(timeout=5))
    notifier = runtime_for(client).notifier  # holds the client weakly
    await until(lambda: notifier.is_subscribed(channel_of(name)), "waiter subscribed", timeout=10)
    await holder.release()
    await (await within(waiting, what="the waiter to get the lock")).release()
    [listener] = [t for t in asyncio.all_tasks() if t.get_name() == "aiolock-notifier"]
    assert not listener.done(), "the subscription lingers after its last waiter"
    dropped = weakref.ref(client)
    await client.aclose()
    del client, waiting
    gc.collect()
    assert dropped() is None, "precondition: nothing of aiolock keeps the client alive"
    proxied.proxy.refuse_new()
    proxied.proxy.reset_all()
    await asyncio.wait_for(listener, 10)  # raises what the listener raised


# --------------------------------------------------------------------------- the proxy itself
async def test_the_proxy_forwards_delays_and_resets(server: RedisServer) -> None:
    """The fault controls do what the tests above rely on."""
    proxy = await FaultProxy(server.port).start()
    client = make_client(proxy.url)
    loop = asyncio.get_running_loop()
    try:
        assert await client.ping()
        proxy.delay_replies(0.3)
        started = loop.time()
        assert await client.ping()
        # uvloop keeps its timers to the millisecond and may fire one a fraction early.
        assert loop.time() - started >= 0.29
        proxy.delay_replies(0.0)
        assert proxy.reset_all() == 1
        await until(lambda: proxy.open_connections == 0, "the reset link is gone", timeout=5)
        # The pooled connection was reset: redis-py 8 reports it once, older versions notice
        # it when the pool hands the connection out, and reconnect. The write on the reset
        # connection raises RuntimeError on uvloop, and AttributeError or TypeError on
        # CPython 3.12 and 3.13 before their fix for gh-136234 (which redis-py passes on).
        with contextlib.suppress(
            redis.exceptions.ConnectionError, RuntimeError, AttributeError, TypeError
        ):
            await client.ping()
        assert await client.ping()  # a new connection works
        proxy.refuse_new()
        await client.connection_pool.disconnect()
        with pytest.raises(redis.exceptions.ConnectionError):
            await client.ping()
        await proxy.restore()
        assert await client.ping()
        proxy.blackhole()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await client.ping()
        await proxy.restore()
        assert await client.ping()
    finally:
        await client.aclose()
        await proxy.aclose()
    assert proxy.open_connections == 0


async def test_acquire_through_the_proxy_is_busy_not_broken_when_held(
    proxied: Proxied, name: str
) -> None:
    """Control: with no fault, a held lock through the proxy is AcquireTimeoutError."""
    holder = await Lock(proxied.direct, name, ttl=5).acquire()
    try:
        with pytest.raises(AcquireTimeoutError):
            await Lock(proxied.client, name, ttl=5).acquire(timeout=0.2)
    finally:
        await holder.release()
