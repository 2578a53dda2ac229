"""Server faults: a frozen, killed, restarted, flushed, exhausted or refusing Redis.

Every test owns its server (the `server` fixture) and may pause, kill or restart it. Clients
are built with `make_client` without setting `socket_timeout` (redis-py's default applies):
the bounds that matter must come from aiolock itself. What each test shows is listed in
docs/guarantees.md ("The server").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from aiolock import AcquireTimeoutError, BackendError, Lease, LeaseLostError, Lock, LossReason
from aiolock._engine.notifier import Notifier
from aiolock._engine.runtime import runtime_for
from aiolock._engine.wait_queue import Waiter
from aiolock._lua.layout import LockKeys
from aiolock._lua.lock import (
    ACQUIRE,
    RELEASE,
    Script,
    acquire_args,
    acquired,
    release_args,
    released,
)
from aiolock._transport.call_options import CallOptions

from ..conftest import CommandLog, counting_connection, make_client
from ..support.load import scaled
from ..support.servers import RedisServer
from ..support.waits import eventually, until_cancelled, within

SCHEDULING_BOUND = 0.25
"""Event-loop scheduling delay allowed between a lease's deadline and the body's cancellation."""


async def wait_for_condition(
    check: Callable[[], Awaitable[bool]], what: str, *, timeout: float = 10.0
) -> None:
    """Poll an async predicate until it holds; fail (not hang) after `timeout` seconds."""
    await eventually(check, what=what, timeout=timeout, interval=0.01)


# --------------------------------------------------------------------------- SIGSTOP
async def test_frozen_server_loses_the_lease_at_its_local_deadline(
    server: RedisServer, name: str
) -> None:
    """Redis is frozen past the ttl: the body is cancelled at the lease's deadline, which
    is earlier than the key's expiry on the server; afterwards the key has expired."""
    client = make_client(server.url)
    loop = asyncio.get_running_loop()
    ttl = 0.5
    try:
        lock = Lock(client, name, ttl=ttl)
        lost_at: float | None = None
        paused_at = 0.0
        before = loop.time()
        with pytest.raises(LeaseLostError) as info:
            async with lock as lease:
                server.pause()
                paused_at = loop.time()
                try:
                    await until_cancelled(what="the loss at the lease's deadline")
                except asyncio.CancelledError:
                    lost_at = loop.time()
                    raise
        assert info.value.reason is LossReason.DEADLINE
        assert info.value.fencing_token == lease.fencing_token
        assert lease.lost and lease.loss_reason is LossReason.DEADLINE
        assert lost_at is not None
        # Nothing was confirmed after the pause, so the deadline comes from a command sent
        # before it: the acquire (sent after `before`) or a renewal. The server cannot
        # have executed that command before it was sent, so its key outlives the deadline.
        assert before + ttl - 0.01 <= lease.deadline <= paused_at + ttl
        # (A timer may fire up to a millisecond early by uvloop's millisecond clock.)
        assert lease.deadline - 0.001 <= lost_at <= lease.deadline + SCHEDULING_BOUND
    finally:
        server.resume()

    try:
        # The key expired by the server's wall clock while it was frozen.
        after = await Lock(client, name, ttl=ttl).acquire(timeout=5)
        try:
            assert after.fencing_token > lease.fencing_token
        finally:
            await after.release()
    finally:
        await client.aclose()


async def test_extend_on_a_frozen_server_waits_until_the_deadline_and_raises_the_loss(
    server: RedisServer, name: str
) -> None:
    """`extend()` waits for Redis up to the lease's deadline: on a frozen server it ends
    in the loss (`DEADLINE`), the `BackendError` of the extend as its cause, not in a
    `BackendError` while the lease is already gone."""
    client = make_client(server.url)
    try:
        lease = await Lock(client, name, ttl=1.0, renew=False).acquire()
        server.pause()
        try:
            with pytest.raises(LeaseLostError) as info:
                await asyncio.wait_for(lease.extend(), 10)
        finally:
            server.resume()
        assert info.value.reason is LossReason.DEADLINE
        assert isinstance(info.value.__cause__, BackendError)
        assert lease.lost and lease.loss_reason is LossReason.DEADLINE
        assert lease.remaining() == 0.0
        with pytest.raises(LeaseLostError):
            await lease.release()
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- restart
async def test_restart_without_data_loses_the_lease_as_not_owner(
    server: RedisServer, name: str
) -> None:
    """kill -9 and restart empty while held: the next renewal says "not owner"; fencing
    tokens issued after the restart are still above every earlier one."""
    client = make_client(server.url)
    try:
        tokens: list[int] = []
        for _ in range(3):
            async with Lock(client, name, ttl=3) as earlier:
                tokens.append(earlier.fencing_token)
        lock = Lock(client, name, ttl=3)  # renewal every 1 s, deadline ~3 s: room to restart
        with pytest.raises(LeaseLostError) as info:
            async with lock as lease:
                tokens.append(lease.fencing_token)
                server.restart_empty()
                await until_cancelled(what="the loss at the next renewal (within 1 s)")
        assert info.value.reason is LossReason.NOT_OWNER
        assert lease.lost and lease.loss_reason is LossReason.NOT_OWNER
        async with Lock(client, name, ttl=3) as after:
            assert after.fencing_token > max(tokens)
    finally:
        await client.aclose()


async def test_fencing_tokens_increase_across_many_restarts(server: RedisServer, name: str) -> None:
    # After a restart the pooled connection is dead. A `from_url` client of redis-py 8 does
    # not retry, and aiolock reports the first failure as BackendError (fail fast, see the
    # README's "busy" vs "broken"): one retry on a fresh connection is the user's setting.
    client = make_client(server.url, retry=Retry(NoBackoff(), 1))
    try:
        tokens: list[int] = []
        for round_ in range(4):
            if round_:
                server.restart_empty()
            for _ in range(5):
                lease = await Lock(client, name, ttl=5).acquire(timeout=5)
                tokens.append(lease.fencing_token)
                await lease.release()
        assert len(tokens) == 20
        assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- crashed holder
def drop(objects: list[Lease]) -> None:
    """Drop the last references to `objects`, and run the cycle collector.

    It is needed when the acquire opened the connection: redis-py's handshake caught errors
    (commands the server does not know) whose tracebacks hold their own frames, cycles that
    from Python 3.12 on keep the callers' frames alive too, the acquire's and its lease."""
    objects.clear()
    gc.collect()


async def test_a_vanished_holder_frees_the_lock_within_its_ttl(
    server: RedisServer, name: str
) -> None:
    """A holder that stops renewing and never releases (a crashed process) blocks others
    for no longer than its remaining ttl: the waiter's fallback poll follows the pttl."""
    client = make_client(server.url)
    other = make_client(server.url)
    loop = asyncio.get_running_loop()
    ttl = scaled(1.0)  # the key must outlast the stalls of a loaded machine until `locked()`
    try:
        lease = await Lock(client, name, ttl=ttl).acquire()
        stopped_at = loop.time()
        lease._stop_renewal()  # the "process" dies: no renewal, no release
        fencing = lease.fencing_token
        dropped = [lease]
        del lease
        with pytest.warns(ResourceWarning, match="garbage-collected without being released"):
            drop(dropped)
        lock = Lock(other, name, ttl=ttl)
        assert await lock.locked(), "dropping the lease must not release it here"
        successor = await lock.acquire(timeout=10)
        acquired_at = loop.time()
        try:
            assert successor.fencing_token > fencing
            # The key was set before `stopped_at` with a full ttl and never renewed.
            assert acquired_at <= stopped_at + ttl + scaled(0.3)
        finally:
            await successor.release()
    finally:
        await client.aclose()
        await other.aclose()


# --------------------------------------------------------------------------- SCRIPT FLUSH
async def test_script_flush_is_invisible_to_the_holder(
    server: RedisServer, name: str, commands: CommandLog
) -> None:
    client = make_client(server.url, commands)
    admin = make_client(server.url)
    try:
        ttl = scaled(0.3)  # no renewal late on a loaded machine
        lock = Lock(client, name, ttl=ttl)
        async with lock as lease:
            mark = commands.mark()
            await admin.script_flush()
            await asyncio.sleep(ttl * 10 / 3)  # three renewals or more
            assert lease.held
            assert await lock.locked()
            sent = commands.since(mark)
            assert sent["EVAL renew"] >= 1, sent  # NOSCRIPT answered by a fallback to EVAL
            assert sent["EVALSHA renew"] >= 2, sent  # and EVALSHA works again after it
            await admin.script_flush()
        assert lease.released and not lease.lost
        assert not await lock.locked()
        async with Lock(client, name, ttl=ttl) as again:
            assert again.fencing_token > lease.fencing_token
    finally:
        await client.aclose()
        await admin.aclose()


# --------------------------------------------------------------------------- exhausted pool
async def test_exhausted_pool_does_not_starve_renewal_or_notification(
    server: RedisServer, name: str, commands: CommandLog
) -> None:
    """The user's only connection is busy in BLPOP for 2 s: renewals (on aiolock's own
    connection) keep the lease, and a waiter elsewhere is woken by the release."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        server.url, max_connections=1, timeout=None, connection_class=counting_connection(commands)
    )
    client = redis.asyncio.Redis.from_pool(pool)
    other = make_client(server.url)
    admin = make_client(server.url)
    try:
        lock = Lock(client, name, ttl=scaled(0.3))  # shorter than the BLPOP's 2 s still
        async with lock as lease:
            mark = commands.mark()
            waiting = asyncio.create_task(Lock(other, name, ttl=30).acquire(timeout=30))

            async def occupy() -> object:
                return await client.blpop([f"{name}:never-pushed"], timeout=2)

            blocking = asyncio.create_task(occupy())

            async def blocked() -> bool:
                info = await admin.info("clients")
                return int(info["blocked_clients"]) == 1

            await wait_for_condition(blocked, "the BLPOP holds the only connection")
            # BLPOP timed out after holding the only connection for 2 s.
            assert await within(blocking, what="the 2 s BLPOP") is None
            assert lease.held and not lease.lost
            assert commands.since(mark)["EVALSHA renew"] >= 3, commands.since(mark)
            assert not waiting.done()
        assert lease.released and not lease.lost
        successor = await asyncio.wait_for(waiting, 5)  # a hang guard
        try:
            assert successor.fencing_token > lease.fencing_token
        finally:
            await successor.release()
    finally:
        await client.aclose()
        await other.aclose()
        await admin.aclose()


# --------------------------------------------------------------------------- ACL
async def test_acl_denial_raises_backend_error_at_once(server: RedisServer, name: str) -> None:
    admin = make_client(server.url)
    limited = make_client(server.url, username="limited", password="pw")
    try:
        await admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval"
        )
        assert await limited.ping()
        lock = Lock(limited, name, ttl=5)
        for timeout in (None, 2.0, 0.0):
            with pytest.raises(BackendError) as info:
                async with asyncio.timeout(10):  # a hang would fail here, not in pytest-timeout
                    await lock.acquire(timeout=timeout)
            assert info.type is BackendError  # not AcquireTimeoutError
            assert isinstance(info.value.__cause__, redis.exceptions.RedisError)
            assert info.value.operation == "acquire"
            assert info.value.name == name
        assert not await admin.exists(lock.key)
    finally:
        await limited.aclose()
        await admin.aclose()


async def test_refused_subscription_does_not_strand_a_waiter(
    server: RedisServer, name: str
) -> None:
    """The waiter's user may not SUBSCRIBE: it cannot be notified, so it must either report
    BackendError or fall back to polling by the holder's pttl (2 s here). Waiting forever
    for the subscription (timeout=None) strands it even after the lock is free."""
    admin = make_client(server.url)
    limited = make_client(server.url, username="nosub", password="pw")
    holder: Lease | None = None
    try:
        await admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "nosub", "on", ">pw", "~*", "&*", "+@all", "-subscribe"
        )
        holder = await Lock(admin, name, ttl=2).acquire()
        waiting = asyncio.create_task(Lock(limited, name, ttl=2).acquire(timeout=None))
        channel = LockKeys.build("aiolock", name).channel
        notifier = runtime_for(limited).notifier

        async def queued_or_done() -> bool:
            return notifier.queue_length(channel) == 1 or waiting.done()

        await wait_for_condition(queued_or_done, "the waiter is queued, or has answered")
        if waiting.done():
            # The refusal is reported at once, as a broken backend (not as contention).
            with pytest.raises(BackendError) as info:
                await waiting
            assert info.value.operation == "subscribe"
            return
        await holder.release()
        try:
            async with asyncio.timeout(10):  # a hang guard: the lock is free from now on
                lease = await waiting
        except BackendError:
            pass  # "broken" is an acceptable answer too
        except TimeoutError:
            pytest.fail(
                "the lock was free for 10 s and the waiter neither took it nor reported "
                "BackendError: stuck waiting for a subscription that is refused"
            )
        else:
            await lease.release()
    finally:
        if holder is not None:
            await holder.release()  # a no-op once released
        await limited.aclose()
        await admin.aclose()


# --------------------------------------------------------------------------- unreachable
async def test_unreachable_server_during_a_timed_acquire_raises_backend_error(
    server: RedisServer, name: str
) -> None:
    client = make_client(server.url)
    loop = asyncio.get_running_loop()
    try:
        assert await client.ping()  # the pool now holds a connection to a server that dies
        server.kill()
        started = loop.time()
        with pytest.raises(BackendError) as info:
            async with asyncio.timeout(10):
                await Lock(client, name, ttl=1).acquire(timeout=2)
        assert info.type is BackendError  # not AcquireTimeoutError
        assert loop.time() - started < 5
    finally:
        await client.aclose()


async def parked(client: redis.asyncio.Redis, name: str) -> None:
    """Wait until one task of this process is queued for `name`, subscribed and asleep in
    its waiter (not in the middle of a Redis command)."""
    notifier = runtime_for(client).notifier
    channel = LockKeys.build("aiolock", name).channel

    async def check() -> bool:
        queue = notifier._queues.get(channel)
        return (
            queue is not None
            and queue.subscribed.is_set()
            and len(queue.waiters) == 1
            and queue.waiters[0]._future is not None
        )

    await wait_for_condition(check, "the waiter is subscribed and asleep")


async def release_dead(lease: Lease) -> None:
    """Release a lease whose server is gone: either error is documented for release()."""
    with contextlib.suppress(LeaseLostError, BackendError):
        await lease.release()


async def test_server_dying_under_a_waiter_raises_backend_error(
    server: RedisServer, name: str
) -> None:
    """A task already waiting (subscribed, asleep) for a held lock learns that Redis is
    gone: BackendError, not AcquireTimeoutError, and not a wait until its timeout."""
    client = make_client(server.url)
    other = make_client(server.url)
    holder: Lease | None = None
    try:
        holder = await Lock(other, name, ttl=1).acquire()
        waiting = asyncio.create_task(Lock(client, name, ttl=1).acquire(timeout=30))
        await parked(client, name)
        server.kill()
        with pytest.raises(BackendError) as info:
            await asyncio.wait_for(waiting, 10)  # a hang guard, far below the 30 s timeout
        assert info.type is BackendError  # not AcquireTimeoutError
        channel = LockKeys.build("aiolock", name).channel
        assert runtime_for(client).notifier.queue_length(channel) == 0
        loss = await asyncio.wait_for(holder.wait_lost(), 5)
        assert loss is not None and loss.reason is LossReason.DEADLINE
    finally:
        if holder is not None:
            await release_dead(holder)
        await client.aclose()
        await other.aclose()


async def test_server_dying_while_a_waiter_subscribes_raises_backend_error(
    server: RedisServer, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis dies between the waiter's first attempt ("held") and its subscription: the
    waiter must still report BackendError, not sit out its whole timeout (or, with
    timeout=None, forever) waiting for a subscription that cannot be made."""
    client = make_client(server.url)
    other = make_client(server.url)
    holder: Lease | None = None
    original_ready = Notifier.ready

    async def ready_after_crash(self: Notifier, waiter: Waiter, *, timeout: float | None) -> None:
        server.kill()
        await original_ready(self, waiter, timeout=timeout)

    try:
        holder = await Lock(other, name, ttl=1).acquire()
        monkeypatch.setattr(Notifier, "ready", ready_after_crash)
        try:
            async with asyncio.timeout(10):  # a hang guard, far below the 30 s timeout
                lease = await Lock(client, name, ttl=1).acquire(timeout=30)
        except AcquireTimeoutError:
            pytest.fail("AcquireTimeoutError (busy) although Redis is gone (broken)")
        except BackendError:
            pass
        except TimeoutError:
            pytest.fail(
                "acquire(timeout=30) still waiting 10 s after Redis died: stuck waiting for "
                "a subscription that cannot be made"
            )
        else:
            await release_dead(lease)
            pytest.fail("acquired a held lock on a dead server")
    finally:
        monkeypatch.undo()
        if holder is not None:
            await release_dead(holder)
        await client.aclose()
        await other.aclose()


# --------------------------------------------------------------------------- idempotent scripts
async def test_scripts_applied_twice_give_the_same_answer(server: RedisServer, name: str) -> None:
    """What redis-py's retry after a lost reply does: the same script twice, one token."""
    client = make_client(server.url)
    keys = LockKeys.build("aiolock", name)

    def acquiring(
        token: str, *, wid: str = "", entry: str = "", claims: tuple[str, ...] = ()
    ) -> list[str | int]:
        pid = os.getpid()
        queue = (wid, 0, entry or f"host {pid}") if wid else None
        return acquire_args(token, 5000, f"host {pid} task", queue=queue, claims=claims)

    def releasing(token: str, abort: str) -> list[str | int]:
        return release_args(token=token, abort=abort == "1")

    try:
        backend = runtime_for(client).backend

        async def run(script: Script, args: list[str | int]) -> Any:
            operation = "acquire" if script is ACQUIRE else "release"
            return await backend.run(
                script, keys.scripts, args, CallOptions(timeout=5, operation=operation, name=name)
            )

        token = secrets.token_hex(16)
        fence = await run(ACQUIRE, acquiring(token))  # (uncontended: the fencing token alone)
        assert isinstance(fence, int) and fence > 0
        assert await run(ACQUIRE, acquiring(token)) == fence
        assert 4000 < await client.pttl(keys.lock) <= 5000

        assert await run(RELEASE, releasing(token, "0")) == 1  # (uncontended: the status alone)
        assert await run(RELEASE, releasing(token, "0")) == [2, b"", b"", b"", 0]
        assert not await client.hexists(keys.lock, "token")

        # A release that grants the lock to a queued token, applied twice: one grant.
        holder = secrets.token_hex(16)
        assert int(acquired(await run(ACQUIRE, acquiring(holder)))[0]) == 1
        registered = secrets.token_hex(16)
        entry = f"host {os.getpid()} 7 1000 5000 {registered} waiter"
        queued = await run(ACQUIRE, acquiring(secrets.token_hex(16), wid="q1", entry=entry))
        assert int(queued[0]) == 0
        granted = await run(RELEASE, releasing(holder, "0"))
        assert granted[:2] == [1, b"q1"] and granted[3] == b"7" and granted[4] == 1000
        assert await run(RELEASE, releasing(holder, "0")) == [2, b"", b"", b"", 0]
        assert await client.hget(keys.lock, "token") == registered.encode()
        assert await client.hget(keys.lock, "fence") == granted[2]
        assert 0 < await client.pttl(keys.lock) <= 1000  # until its holder renews it
        # Claimed by the queue's next acquire (the grant was not heard of in time), twice.
        claimer = secrets.token_hex(16)
        claim_args = acquiring(claimer, wid="q1", entry=entry, claims=(registered,))
        assert [int(v) for v in acquired(await run(ACQUIRE, claim_args))] == [1, int(granted[2])]
        assert [int(v) for v in acquired(await run(ACQUIRE, claim_args))] == [1, int(granted[2])]
        assert 4000 < await client.pttl(keys.lock) <= 5000
        assert released(await run(RELEASE, releasing(claimer, "0"))) == [1, b"", b"", b"", 0]
        fence = int(granted[2])

        aborted = secrets.token_hex(16)
        assert await run(RELEASE, releasing(aborted, "1")) == [0, b"", b"", b"", 0]
        late = await run(ACQUIRE, acquiring(aborted))
        assert isinstance(late, list)
        assert [int(v) for v in late] == [-1, 0]
        assert not await client.hexists(keys.lock, "token"), "an aborted token is never granted"

        # The lock itself is unaffected: a fresh token gets it, with a larger fencing token.
        fresh = await run(ACQUIRE, acquiring(secrets.token_hex(16)))
        assert isinstance(fresh, int) and fresh > fence
        lease: Lease | None = await Lock(client, name, ttl=5).try_acquire()
        assert lease is None
    finally:
        await client.aclose()
