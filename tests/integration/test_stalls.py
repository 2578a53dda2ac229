"""Event-loop stalls: how a lease reports them, and which leases survive them.

A blocking call in the body (or a paused process) stops the event loop. A lease survives a
stall shorter than what Redis was told (its ttl since the last confirmed renewal), whether
it was acquired or handed over by a release; one that does not survive says it was a
stall, for how long, and whether the body ran to its end after the loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from aiolock import (
    BackendError,
    EventKind,
    Lease,
    LeaseLostError,
    Lock,
    LossReason,
    Redlock,
)
from aiolock._engine.lease_issuing import LeaseIssuing
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock._lua.lease import RENEW, RESUME
from aiolock._transport.base import pooled
from aiolock._transport.call_options import CallOptions

from ..conftest import CommandLog, make_client
from ..deployments.proxy import ThreadedProxy
from ..support.recorded import recorded
from ..support.servers import RedisServer, ServerBinary, independent_servers, quorum_calls_ended
from ..support.waits import closed, eventually
from .test_commands import warm_up

pytestmark = pytest.mark.real_only

STALL = 1.5
"""Longer than a grant's short expiry (1 s), far shorter than the leases' ttl (30 s)."""


@pytest.fixture
async def pair(
    server_url: str, name: str
) -> AsyncIterator[tuple[redis.asyncio.Redis, redis.asyncio.Redis, CommandLog]]:
    """Two processes' clients; the second logs its commands. Scripts loaded beforehand."""
    log = CommandLog()
    a, b = make_client(server_url), make_client(server_url, log)
    try:
        for client in (a, b):
            warm = await Lock(client, f"{name}:warm-up").acquire()
            await warm.extend()
            await warm.release()
        yield a, b, log
    finally:
        await a.aclose()
        await b.aclose()


async def queued(
    client: redis.asyncio.Redis | RedisCluster,
    name: str,
    *,
    waiter: redis.asyncio.Redis | RedisCluster | None = None,
) -> None:
    """Wait until a waiter on `waiter` (default: `client`) is queued in Redis and has read the answer
    that queued it: a release sent while its attempt is in flight does not put the
    process's queue in line (the waiter is then granted as any other process is)."""
    keys = LockKeys.build("aiolock", name)
    notifier = runtime_for(waiter or client).notifier
    async with asyncio.timeout(10):
        while True:
            queue = notifier.queue_for(keys.channel)
            if queue is not None and not queue.attempting and await client.zcard(keys.queue):
                return
            await asyncio.sleep(0.005)


async def stall_at_entry(lease: Lease) -> None:
    """The body blocks the event loop at once, then lets it run."""
    async with lease:
        time.sleep(STALL)
        await asyncio.sleep(0.05)  # the loop reads the renewal's reply, waiting since
        assert not lease.lost, f"lost by the stall: {lease.loss_reason}"
        assert lease.held, "the lease must be held after the stall"


async def test_a_lease_handed_over_by_another_process_survives_a_stall_at_entry(
    pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, CommandLog], name: str
) -> None:
    a, b, log = pair
    holder = await Lock(a, name, ttl=30).acquire()
    waiting = asyncio.create_task(Lock(b, name, ttl=30).acquire())
    await queued(a, name, waiter=b)
    mark = log.mark()
    await holder.release()
    lease = await asyncio.wait_for(waiting, 10)
    # Taken from the grant, not claimed by an acquire: the grant's short expiry applies...
    assert log.since(mark) == Counter({"EVAL renew_holder": 1})
    # ...and its renewal to the full ttl left before the body, so the stall is survived.
    await stall_at_entry(lease)
    assert lease.released


async def test_without_renew_on_handoff_a_handed_over_lease_costs_no_command_of_its_own(
    pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, CommandLog], name: str
) -> None:
    """`renew_on_handoff=False`: a lease handed over by another process's release starts
    its block with no command of its own (the grant holds it); the watchdog renews it to
    the full ttl within a third of the grant's 0.9 s."""
    a, b, log = pair
    await b.script_load(RENEW.source)  # the watchdog's script, known to the server
    holder = await Lock(a, name, ttl=30).acquire()
    waiting = asyncio.create_task(Lock(b, name, ttl=30, renew_on_handoff=False).acquire())
    await queued(a, name, waiter=b)
    mark = log.mark()
    with recorded(EventKind.RENEWED) as renewed:
        await holder.release()
        lease = await asyncio.wait_for(waiting, 10)
        assert log.since(mark) == Counter()
        assert lease.remaining() < 1.0  # the grant's
        await eventually(lambda: bool(renewed), what="the watchdog's renewal", timeout=5.0)
    assert lease.remaining() > 20, lease.remaining()  # renewed to the ttl
    assert sum(log.since(mark).values()) == 1  # that renewal
    await lease.release()


async def test_without_renew_on_handoff_a_stall_at_entry_past_the_grant_loses_the_lease(
    pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, CommandLog], name: str
) -> None:
    """The trade `renew_on_handoff=False` makes: a stall right after a hand-off from
    another process that outlasts the grant's 0.9 s loses the lease (the default survives
    it: `test_a_lease_handed_over_by_another_process_survives_a_stall_at_entry`)."""
    a, b, _ = pair
    holder = await Lock(a, name, ttl=30).acquire()
    waiting = asyncio.create_task(Lock(b, name, ttl=30, renew_on_handoff=False).acquire())
    await queued(a, name, waiter=b)
    await holder.release()
    lease = await asyncio.wait_for(waiting, 10)
    with pytest.raises(LeaseLostError):
        async with lease:
            time.sleep(STALL)
            await asyncio.sleep(0.05)
    assert lease.loss_reason is LossReason.DEADLINE


async def test_a_granted_lease_writes_its_renewal_without_waiting_for_the_loop(
    pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, CommandLog],
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Taking another process's grant writes the renewal to the full ttl at once (an eager
    task), so the body starts without the loop turning in between: a cross-process
    hand-off costs no extra turns of a busy loop."""
    a, b, _ = pair
    if await _checkout_turns(b):
        pytest.skip("this redis-py's pool waits for the loop to hand out a connection (5.0)")
    assert await turns_taking_grant(a, b, name, monkeypatch) == [0], "the loop turned"


async def turns_taking_grant(
    a: redis.asyncio.Redis | RedisCluster,
    b: redis.asyncio.Redis | RedisCluster,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> list[int]:
    """A lock `name` held on `a` is released to a waiter on `b`: how often the event loop
    turned while `b` took the grant (a list with one count), a ticker running meanwhile.

    A grant heard more than half its 0.9 s after the waiter's registration (a loaded
    machine) is claimed by an acquire instead of taken, and counts nothing: the hand-off is
    then made again, at most 3 times in all."""
    taking: list[int] = []
    for _ in range(3):
        taking = await _turns_taking_grant(a, b, name, monkeypatch)
        if taking:
            break
    return taking


async def _turns_taking_grant(
    a: redis.asyncio.Redis | RedisCluster,
    b: redis.asyncio.Redis | RedisCluster,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> list[int]:
    loop = asyncio.get_running_loop()
    turns = 0

    def tick() -> None:
        nonlocal turns
        turns += 1
        if not done.is_set():
            loop.call_soon(tick)

    taking: list[int] = []
    take_grant = LeaseIssuing.take_grant

    async def counted(self: Any, *args: Any) -> None:
        before = turns
        await take_grant(self, *args)
        taking.append(turns - before)

    done = asyncio.Event()
    with monkeypatch.context() as patched:
        patched.setattr(LeaseIssuing, "take_grant", counted)
        holder = await Lock(a, name, ttl=30).acquire()
        waiting = asyncio.create_task(Lock(b, name, ttl=30).acquire())
        await queued(a, name, waiter=b)
        loop.call_soon(tick)
        try:
            await holder.release()
            lease = await asyncio.wait_for(waiting, 10)
        finally:
            done.set()
        await lease.release()
    return taking


async def test_a_granted_leases_renewal_that_lands_after_its_release_is_not_a_loss(
    pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, CommandLog],
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The body of a lease taken from another process's grant starts once its renewal is
    written; a short body releases while that renewal is in flight, on another
    connection, and Redis may run the release first. The renewal then finds the lock no
    longer this token's: the lease was released, not lost (no LOST event, no error)."""
    a, b, _ = pair
    grantee = runtime_for(b).backend
    backend = type(grantee)
    run = backend.run
    renewing, released, renewed = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def release_first(
        self: Any, script: Any, keys: Any, args: Any, options: CallOptions
    ) -> Any:
        operation = options.operation
        if self is grantee and operation == "renew" and options.by_text:
            renewing.set()
            assert options.on_sent is not None
            options.on_sent()  # taken for written: the body starts
            await asyncio.wait_for(released.wait(), 10)  # ...and Redis runs the release first
            try:
                return await run(self, script, keys, args, options)
            finally:
                renewed.set()
        reply = await run(self, script, keys, args, options)
        if self is grantee and operation == "release" and renewing.is_set():
            # Applied; the renewal's answer is read before the release's.
            released.set()
            await asyncio.wait_for(renewed.wait(), 10)
        return reply

    monkeypatch.setattr(backend, "run", release_first)
    holder = await Lock(a, name, ttl=30).acquire()
    waiting = asyncio.create_task(Lock(b, name, ttl=30).acquire())
    await queued(a, name, waiter=b)
    with recorded(EventKind.LOST) as lost:
        await holder.release()
        lease = await asyncio.wait_for(waiting, 10)
        async with lease:
            pass
    assert renewed.is_set()
    assert lease.released and not lease.lost and not lost, lease.loss_reason


async def _checkout_turns(client: redis.asyncio.Redis) -> int:
    """How often the loop turns while `client`'s pool hands out an open connection: redis-py
    5.0 reads the socket with a zero timeout first, which waits for the loop."""
    loop = asyncio.get_running_loop()
    await client.ping()  # a connection open in the pool
    turns, counting = 0, True

    def tick() -> None:
        nonlocal turns
        turns += 1
        if counting:
            loop.call_soon(tick)

    loop.call_soon(tick)
    await asyncio.sleep(0)  # the counter runs
    before = turns
    connection = await pooled(client.connection_pool, "PING")
    counting, taken = False, turns - before
    await client.connection_pool.release(connection)
    return taken


@pytest.mark.parametrize("heard_late", [False, True], ids=["at-once", "heard-late"])
async def test_a_lease_handed_over_inside_the_process_survives_a_stall_at_entry(
    client: redis.asyncio.Redis, name: str, commands: CommandLog, heard_late: bool
) -> None:
    await warm_up(client, name)  # the release script known: one EVALSHA, whatever ran before
    holder = await Lock(client, name, ttl=30).acquire()
    waiting = asyncio.create_task(Lock(client, name, ttl=30).acquire())
    await queued(client, name)
    mark = commands.mark()
    await holder.release()
    if heard_late:  # the loop is held before the waiter takes its grant (a loaded machine)
        time.sleep(0.4)
    lease = await asyncio.wait_for(waiting, 10)
    # The release granted it straight to this process's waiter, for the full ttl: nothing
    # more is sent for it, however late the waiter took it.
    assert commands.since(mark) == Counter({"EVALSHA release": 1})
    assert lease.remaining() > 29
    await stall_at_entry(lease)
    assert lease.released


async def test_a_stall_past_the_deadline_is_told_as_a_stall_when_read(
    client: redis.asyncio.Redis, name: str
) -> None:
    await client.ping()  # a connection open: the acquire must be answered within 0.3 s
    lease = await Lock(client, name, ttl=0.3, renew=False).acquire()
    time.sleep(0.5)
    # Read before the event loop has run again: true to the clock already.
    assert lease.lost
    assert lease.loss_reason is LossReason.DEADLINE
    assert lease.remaining() == 0.0 and not lease.held
    error = lease.loss_error()
    assert error.stalled_for is not None and error.stalled_for >= 0.1
    assert "event loop did not run" in str(error)
    with pytest.raises(LeaseLostError):
        await lease.release()


async def test_a_body_that_finished_after_the_loss_says_so(
    client: redis.asyncio.Redis, name: str
) -> None:
    await client.ping()  # a connection open: the acquire must be answered within 0.3 s
    with pytest.raises(LeaseLostError) as info:
        async with Lock(client, name, ttl=0.3, renew=False):
            time.sleep(0.5)  # the body ends without another await
    assert info.value.body_completed is True
    assert info.value.stalled_for is not None and info.value.stalled_for >= 0.1
    assert "ran to its end after the loss" in str(info.value)


async def test_a_body_cancelled_by_the_loss_says_so(client: redis.asyncio.Redis, name: str) -> None:
    lock = Lock(client, name, ttl=1)
    with pytest.raises(LeaseLostError) as info:
        async with lock:
            await client.delete(lock.key)
            await asyncio.sleep(10)  # cancelled at the next renewal
    assert info.value.body_completed is False
    assert info.value.stalled_for is None
    assert "cancelled midway" in str(info.value)


async def test_a_renewal_confirmed_during_a_stall_is_not_a_loss(
    client: redis.asyncio.Redis, name: str, commands: CommandLog
) -> None:
    """The stall starts just after a renewal was written: Redis confirms it meanwhile, and
    the reply waits, unread, until the loop runs again, after the deadline it had before
    (but before the renewal's own)."""
    await warm_up(client, name)  # the renewal script known: a NOSCRIPT would come too late
    lease = await Lock(client, name, ttl=1.0, renew_interval=0.5).acquire()
    old_deadline = lease.deadline
    mark = commands.mark()
    async with asyncio.timeout(5):
        while not commands.since(mark)["EVALSHA renew"]:
            await asyncio.sleep(0)  # the renewal is written as it is logged
    loop = asyncio.get_running_loop()
    time.sleep(max(old_deadline - loop.time(), 0) + 0.2)
    await asyncio.sleep(0.01)
    assert not lease.lost, f"a confirmed renewal was counted as missing: {lease.loss_reason}"
    assert lease.deadline > old_deadline + 0.3
    await lease.release()


async def test_max_hold_bounds_how_long_a_hung_holder_keeps_the_lock(
    client: redis.asyncio.Redis, name: str
) -> None:
    loop = asyncio.get_running_loop()
    lock = Lock(client, name, ttl=1, max_hold=1.5)
    started = loop.time()

    async def hung() -> None:
        async with lock:
            await asyncio.sleep(30)

    holder = asyncio.create_task(hung())
    async with asyncio.timeout(10):
        while not await lock.locked():
            await asyncio.sleep(0.01)
    lease = await Lock(client, name, ttl=1).acquire(timeout=10)
    waited = loop.time() - started
    # (well below max_hold + ttl, 2.5 s: the bound is max_hold, not a ttl after it)
    assert waited <= 1.5 + 0.7, f"a hung holder kept the lock {waited:.2f}s (max_hold 1.5)"
    with pytest.raises(LeaseLostError) as info:
        await holder
    assert info.value.reason is LossReason.MAX_HOLD
    await lease.release()


def _shut(loop: asyncio.AbstractEventLoop, client: redis.asyncio.Redis) -> None:
    """Close `client` and end every task of `loop` (not running), then close the loop."""
    loop.run_until_complete(client.aclose())
    closed(loop)


def _acquire_in_another_loop(
    url: str, name: str, *, close: bool
) -> tuple[Lease, asyncio.AbstractEventLoop, redis.asyncio.Redis]:
    """A lease acquired in an event loop of another thread (closed after, if `close`)."""
    box: dict[str, object] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        client = redis.asyncio.Redis.from_url(url)

        async def acquire() -> None:
            box["lease"] = await Lock(client, name, ttl=10).acquire()

        loop.run_until_complete(acquire())
        box["loop"], box["client"] = loop, client
        if close:
            _shut(loop, client)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    lease, loop, client = box["lease"], box["loop"], box["client"]
    assert isinstance(lease, Lease)
    assert isinstance(loop, asyncio.AbstractEventLoop)
    assert isinstance(client, redis.asyncio.Redis)
    return lease, loop, client


async def _freed(url: str, name: str) -> None:
    """Assert that lock `name` is held by nobody (read by a client of its own)."""
    checker = make_client(url)
    try:
        assert not await checker.hexists(LockKeys.build("aiolock", name).lock, "token"), "held"
    finally:
        await checker.aclose()


async def test_a_lease_whose_loop_closed_is_lost_and_can_be_released_here(
    server_url: str, name: str
) -> None:
    lease, _, _ = _acquire_in_another_loop(server_url, name, close=True)
    assert lease.lost and lease.loss_reason is LossReason.LOOP_CLOSED
    assert lease.remaining() == 0.0
    with pytest.raises(LeaseLostError) as info:
        await lease.release()
    assert info.value.reason is LossReason.LOOP_CLOSED
    await _freed(server_url, name)


async def test_a_connection_of_its_own_that_fails_to_close_does_not_change_the_release(
    server_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release of a lease whose loop closed goes on a connection of its own, closed
    after; closing it fails (its socket already gone, say). The release's outcome is what
    Redis answered: the key freed, the loss told (`LOOP_CLOSED`), not the closing's error."""
    lease, _, _ = _acquire_in_another_loop(server_url, name, close=True)
    disconnect = redis.asyncio.ConnectionPool.disconnect
    closings: list[object] = []

    async def failing(self: redis.asyncio.ConnectionPool, *args: Any, **kwargs: Any) -> None:
        await disconnect(self, *args, **kwargs)  # closed all the same: nothing left open
        closings.append(self)
        raise OSError("the socket was gone already")

    with monkeypatch.context() as patched:
        patched.setattr(redis.asyncio.ConnectionPool, "disconnect", failing)
        with pytest.raises(LeaseLostError) as info:
            await lease.release()
    assert closings, "the release did not go on a connection of its own"
    assert info.value.reason is LossReason.LOOP_CLOSED
    await _freed(server_url, name)


async def test_releasing_a_lease_of_a_loop_still_open_elsewhere_is_refused(
    server_url: str, name: str
) -> None:
    lease, loop, client = _acquire_in_another_loop(server_url, name, close=False)
    checker = make_client(server_url)
    key = LockKeys.build("aiolock", name).lock
    try:
        with pytest.raises(RuntimeError, match="another event loop"):
            await lease.release()
        assert await checker.hexists(key, "token"), "nothing was sent"

        def release_there() -> None:
            loop.run_until_complete(lease.release())

        await asyncio.to_thread(release_there)
        assert not await checker.hexists(key, "token")
    finally:
        await checker.aclose()
        await asyncio.to_thread(_shut, loop, client)


SHORT_STALL = 0.9
"""Longer than what a lease granted 0.1 s after its registration, its grant heard 0.1 s late,
has left (about 0.7 s of its 0.9 s grant), far shorter than 2/3 of the ttl (20 s): a stall
the README says is survived."""


@pytest.fixture
async def slow_pair(
    server: RedisServer, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[redis.asyncio.Redis, redis.asyncio.Redis, ThreadedProxy]]:
    """Two processes' clients (with the settings `request.param`), the second through a
    proxy in a thread of its own (whose replies a test can slow down, also while the
    test's event loop is blocked), scripts loaded."""
    settings: dict[str, Any] = getattr(request, "param", {})
    proxy = await ThreadedProxy(server.port).start()
    a = make_client(server.url, **settings)
    b = make_client(proxy.url, **settings)
    try:
        for client in (a, b):
            warm = await Lock(client, "warm-up").acquire()
            await warm.extend()
            await warm.release()
        yield a, b, proxy
    finally:
        await proxy.do(lambda p: p.restore())
        await a.aclose()
        await b.aclose()
        await proxy.aclose()


async def _granted_then_stalled(
    pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, ThreadedProxy], name: str
) -> Lease:
    """The second client's process is granted the lock by the first's release 0.1 s after
    it queued, and its body blocks the event loop for SHORT_STALL at once. Its replies are
    slowed by 0.1 s from the release on, so that the renewal Redis confirms is answered
    during the stall, never before it. (A grant heard later than half its 0.9 s after the
    registration is claimed by an acquire instead, with the full ttl: on a loaded machine
    a longer wait here would leave no stall to survive.)"""
    holder_client, waiter_client, proxy = pair
    holder = await Lock(holder_client, name, ttl=30).acquire()
    entered: list[float] = []
    leases: list[Lease] = []

    async def waiter() -> None:
        async with Lock(waiter_client, name, ttl=30) as lease:
            leases.append(lease)
            entered.append(lease.remaining())
            time.sleep(SHORT_STALL)
            await asyncio.sleep(0.05)  # the loop reads what arrived meanwhile
            assert not lease.lost, f"lost by the stall: {lease.loss_reason}"
            assert lease.held

    task = asyncio.create_task(waiter())
    await queued(holder_client, name, waiter=waiter_client)
    await asyncio.sleep(0.1)
    await proxy.do(lambda p: p.delay_replies(0.1))
    await holder.release()
    await asyncio.wait_for(task, 10)
    assert entered[0] < SHORT_STALL, f"{entered[0]:.3f}s left at entry: no stall to survive"
    return leases[0]


async def test_a_granted_lease_survives_a_stall_when_the_server_had_not_the_renewal_script(
    slow_pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, ThreadedProxy], name: str
) -> None:
    """The grant's renewal is the first renewal the server sees since its scripts were
    flushed (a new or restarted server): it must not wait for a NOSCRIPT answer and a
    second send, which would come after the stall."""
    await slow_pair[0].script_flush()
    lease = await _granted_then_stalled(slow_pair, name)
    assert lease.released


@pytest.mark.parametrize("slow_pair", [{"socket_timeout": 0.3}], indirect=True)
async def test_a_granted_lease_survives_a_stall_longer_than_the_clients_socket_timeout(
    slow_pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, ThreadedProxy], name: str
) -> None:
    """The client reads with a socket timeout shorter than the stall: the renewal's reply,
    confirmed by Redis while the loop was blocked, is read all the same (aiolock bounds
    its calls itself)."""
    lease = await _granted_then_stalled(slow_pair, name)
    assert lease.released


async def test_a_granted_lease_survives_a_stall_with_its_reply_waiting(
    slow_pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, ThreadedProxy], name: str
) -> None:
    """The plain case: the renewal is confirmed during the stall, its reply read after."""
    lease = await _granted_then_stalled(slow_pair, name)
    assert lease.released


async def test_a_lease_lost_before_its_block_began_is_acquired_again(
    client: redis.asyncio.Redis, name: str
) -> None:
    """A stall between the acquire and the start of the body (a grant that lapsed before
    its renewal reached Redis, on a loaded machine) loses the lease before any work ran
    under it: `async with` acquires again, within its timeout, instead of raising."""
    taken: list[Lease] = []

    class StalledAfterAcquire(Lock):  # type: ignore[misc]  # a stall, where it can happen
        async def acquire(self, **kwargs: Any) -> Lease:
            lease = await super().acquire(**kwargs)
            if not taken:
                time.sleep(0.5)  # the loop is held past the lease's 0.3 s
            taken.append(lease)
            return lease

    lock = StalledAfterAcquire(client, name, ttl=0.3, renew=False, timeout=10)
    await client.ping()  # a connection open: the acquire must be answered within 0.3 s
    async with lock as lease:
        assert lease.held
    assert len(taken) == 2
    assert taken[0].lost and taken[0].loss_reason is LossReason.DEADLINE
    assert lease.fencing_token > taken[0].fencing_token
    assert lease.released


async def resume_after_a_stall(
    client: redis.asyncio.Redis, name: str, commands: CommandLog, *, script_known: bool
) -> pytest.ExceptionInfo[LeaseLostError]:
    """Resume a lease of ttl 0.5 s held under a token, the loop stalled (0.8 s) right
    after the resume was written; the loss it raises. With the script unknown to the
    server, the EVALSHA is refused and its EVAL is written after the stall, when the
    call's time is already spent."""
    await warm_up(client, name)
    if script_known:
        await client.script_load(RESUME.source)
    else:
        await client.script_flush()
    token = secrets.token_hex(16)
    first = await Lock(client, name, ttl=30).acquire(token=token)
    lock = Lock(client, name, ttl=0.5)
    mark = commands.mark()
    resuming = asyncio.create_task(lock.resume(token))
    async with asyncio.timeout(5):
        while not any("resume" in command for command in commands.since(mark)):
            await asyncio.sleep(0)  # the resume is written as it is logged
    time.sleep(0.8)  # past the resumed lease's validity (0.5 s)
    try:
        with pytest.raises(LeaseLostError) as info:
            await asyncio.wait_for(resuming, 5)
    finally:
        with contextlib.suppress(LeaseLostError):
            await first.release()
    return info


async def test_a_resume_answered_after_the_leases_validity_is_given_back_as_a_loss(
    client: redis.asyncio.Redis, name: str, commands: CommandLog
) -> None:
    """The reply, read late, hands out no lease whose validity is not positive: its
    loss is raised (`DEADLINE`, told as a stall), as `acquire()` gives back a late
    answer."""
    info = await resume_after_a_stall(client, name, commands, script_known=True)
    assert info.value.reason is LossReason.DEADLINE
    assert info.value.stalled_for is not None and info.value.stalled_for >= 0.1


async def test_a_resume_whose_time_a_stall_spent_before_it_was_written_is_a_loss(
    server: RedisServer, name: str, commands: CommandLog
) -> None:
    """Its EVAL written after the stall has no time left: the loss (`DEADLINE`, told as
    a stall), not a `BackendError` saying Redis did not answer. (A server of its own: its
    scripts are flushed.)"""
    client = make_client(server.url, commands)
    try:
        info = await resume_after_a_stall(client, name, commands, script_known=False)
    finally:
        await client.aclose()
    assert info.value.reason is LossReason.DEADLINE
    assert info.value.stalled_for is not None and info.value.stalled_for >= 0.1
    # The EVAL's reply not read within the time (its error the cause), or read late (on
    # uvloop, which reads it sooner after the stall): the loss either way.
    cause = info.value.__cause__
    assert cause is None or isinstance(cause, BackendError), repr(cause)


@pytest.mark.parametrize("timeout", [0.3, None], ids=["timed", "untimed"])
async def test_an_acquire_whose_time_a_stall_spent_before_it_was_written_is_no_backend_error(
    server: RedisServer, name: str, commands: CommandLog, timeout: float | None
) -> None:
    """The server does not know the acquire script: its EVAL is written after a stall
    that spent the attempt's time. The attempt counts as refused (it is given back), not
    as a `BackendError` saying that Redis did not answer: the acquire tries again (a
    timed one once more, its last try within the attempt's minimum reply window) and
    gets the free lock. (A server of its own: its scripts are flushed.)"""
    client = make_client(server.url, commands)
    try:
        await warm_up(client, name)
        await client.script_flush()
        mark = commands.mark()
        acquiring = asyncio.create_task(Lock(client, name, ttl=0.5).acquire(timeout=timeout))
        async with asyncio.timeout(5):
            while not any("acquire" in command for command in commands.since(mark)):
                await asyncio.sleep(0)  # the acquire is written as it is logged
        time.sleep(0.8)  # past the attempt's bound (the validity, 0.5 s; the timeout)
        lease = await asyncio.wait_for(acquiring, 5)
        assert lease.held
        await lease.release()
    finally:
        await client.aclose()


async def test_a_redlock_resume_whose_time_a_stall_spent_is_a_loss_not_a_quorum_error(
    binaries: list[ServerBinary], name: str, commands: CommandLog
) -> None:
    """The nodes do not know the resume script: its EVALs are written after a stall that
    spent the nodes' time (node timeout 0.1 s). The resume raises the lease's loss
    (`DEADLINE`, told as a stall), not a `QuorumError` naming every healthy node as not
    answering. (Servers of its own: their scripts are flushed.)"""
    with independent_servers(binaries[0], 3) as servers:
        nodes = [make_client(server.url, commands) for server in servers]
        try:
            held = await Redlock(nodes, name, ttl=30).acquire()
            for node in nodes:
                await node.script_flush()
            lock = Redlock(nodes, name, ttl=0.5, node_timeout=0.1)
            mark = commands.mark()
            resuming = asyncio.create_task(lock.resume(held.token))
            async with asyncio.timeout(5):
                while sum(n for c, n in commands.since(mark).items() if "resume" in c) < 3:
                    await asyncio.sleep(0)  # the resumes are written as they are logged
            time.sleep(0.8)  # past the node timeout and the resumed lease's validity
            with pytest.raises(LeaseLostError) as info:
                await asyncio.wait_for(resuming, 5)
            assert info.value.reason is LossReason.DEADLINE
            assert info.value.stalled_for is not None
            with contextlib.suppress(LeaseLostError):
                await held.release()
        finally:
            for node in nodes:
                await quorum_calls_ended([node])
                await node.aclose()
