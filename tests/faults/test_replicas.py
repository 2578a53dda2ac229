"""`replicas=N`: an acquire, a hand-off and every renewal count only once N replicas have
them (`WAIT`, sent right after the script on the same connection).

Each test owns its servers: a primary with one replica (`--replicaof`), which it may pause
(SIGSTOP, by PID) so that the primary's writes stop being acknowledged, or a Sentinel
deployment (see `sentinel.py`) whose replica replicates through a fault proxy, so that a
write can be kept from it until the failover that promotes it. What they show is listed in
the README's "Deployments".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from aiolock import (
    AcquireTimeoutError,
    BackendError,
    EventKind,
    LeaseLostError,
    Lock,
    LossReason,
    ReadWriteLock,
    ReplicationError,
    Semaphore,
    locked,
)
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys

from ..deployments.proxy import FaultProxy
from ..deployments.sentinel import SentinelGroup, _ask, closing, replicated
from ..support.load import scaled
from ..support.recorded import recorded
from ..support.servers import RedisServer, ServerBinary
from ..support.waits import eventually, within

pytestmark = pytest.mark.real_only


class Pair:
    """A primary and one replica, in sync."""

    def __init__(self, binary: ServerBinary) -> None:
        args = ("--repl-diskless-sync-delay", "0")
        self.primary = RedisServer(binary, extra_args=args).start()
        try:
            self.replica = RedisServer(
                binary, extra_args=(*args, "--replicaof", "127.0.0.1", str(self.primary.port))
            ).start()
        except BaseException:
            self.primary.stop()
            raise

    def stop(self) -> None:
        self.replica.resume()
        self.replica.stop()
        self.primary.stop()

    async def in_sync(self) -> None:
        async def up() -> bool:
            info = await _ask(self.replica.port, "INFO", "replication")
            return bool(info.get("master_link_status") == "up")

        await eventually(up, what="the replica in sync with the primary", timeout=20.0)
        await replicated(self.primary.port, timeout=10.0)

    async def on_replica(self, name: str) -> int | None:
        """The fencing token of the lease the replica knows holds lock `name` (None: free)."""
        return await holder_on(self.replica.port, name)

    async def on_primary(self, name: str) -> int | None:
        return await holder_on(self.primary.port, name)


async def holder_on(port: int, name: str) -> int | None:
    """The fencing token of the holder of lock `name` on the server at `port`, or None."""
    client = redis.asyncio.Redis(port=port)
    try:
        holder = await Lock(client, name).info()
    finally:
        await client.aclose()
    return None if holder is None else holder.fencing_token


@pytest.fixture
async def pair(binaries: list[ServerBinary]) -> AsyncIterator[Pair]:
    pair = Pair(binaries[0])
    try:
        await pair.in_sync()
        yield pair
    finally:
        pair.stop()


def client_of(port: int) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(port=port)


async def queued(client: redis.asyncio.Redis, keys: LockKeys) -> None:
    """Wait until a waiter of another client is in the lock's queue in Redis."""

    async def in_queue() -> bool:
        return int(await client.zcard(keys.queue)) == 1

    await eventually(in_queue, what="the waiter queued in Redis", timeout=5.0)


# ------------------------------------------------------------------- no replica at all
async def test_an_acquire_no_replica_acknowledges_is_given_back_and_raises(
    server: RedisServer, name: str
) -> None:
    """On a server without replicas, `replicas=1` can never be met: every way of acquiring
    raises `ReplicationError` (a `BackendError`: broken, not busy) within the
    replica_timeout, and leaves the lock free for the next acquirer."""
    client = client_of(server.port)
    lock = Lock(client, name, ttl=5, replicas=1, replica_timeout=0.05)
    try:
        for attempt in (lock.acquire, lock.try_acquire, lambda: lock.acquire(timeout=0)):
            with pytest.raises(ReplicationError) as info:
                await within(attempt(), what="the unconfirmed acquire", timeout=5.0)
            assert (info.value.replicas, info.value.acknowledged) == (1, 0)
            assert info.value.operation == "acquire" and info.value.name == name
            assert "0 of the 1 replicas" in str(info.value)
        lease = await Lock(client, name, ttl=5).acquire(timeout=0)  # nothing left held
        await lease.release()
        with pytest.raises(ReplicationError):
            async with Semaphore(client, name, limit=2, replicas=1, replica_timeout=0.05):
                pytest.fail("the body ran without the replica's acknowledgement")
        with pytest.raises(ReplicationError):
            async with ReadWriteLock(client, name, replicas=1, replica_timeout=0.05).read():
                pytest.fail("the body ran without the replica's acknowledgement")

        @locked(name, client=client, replicas=1, replica_timeout=0.05)
        async def job() -> None:
            pytest.fail("the function ran without the replica's acknowledgement")

        with pytest.raises(ReplicationError):
            await job()
    finally:
        await client.aclose()


async def test_a_replicated_call_that_meets_noscript_waits_for_the_replicas_once(
    server: RedisServer, name: str
) -> None:
    """The first acquire on a server that does not know the script: EVALSHA (refused,
    NOSCRIPT) and its WAIT, then EVAL and its WAIT. The first WAIT waits for nothing (the
    script did not run) and would block for its whole timeout: half of the call's bound
    (1 s for a single try), so the EVAL's WAIT could not fit in the rest, and the call
    timed out instead of saying that no replica acknowledged. Its reply is not waited
    for: the acquire raises `ReplicationError` within its bound."""
    client = client_of(server.port)
    try:
        await client.script_flush()
        lock = Lock(client, name, ttl=10, replicas=1)  # WAIT: half the 1 s bound
        with pytest.raises(ReplicationError) as info:
            await within(lock.acquire(timeout=0), what="the unconfirmed acquire", timeout=10.0)
        assert (info.value.replicas, info.value.acknowledged) == (1, 0)
        assert not await lock.locked()
    finally:
        await client.aclose()


# ------------------------------------------------------------------- primary + replica
async def test_an_acquire_returns_once_the_replica_has_it_in_one_round_trip(
    pair: Pair, name: str
) -> None:
    """The WAIT travels with the acquire script (one request on the wire), the replica has
    the key when `acquire()` returns, and renewals are confirmed by it as they go."""
    proxy = await FaultProxy(pair.primary.port).start()
    client = redis.asyncio.Redis(port=proxy.port)
    try:
        await client.ping()
        loop = asyncio.get_running_loop()
        since = loop.time()
        with recorded(EventKind.RENEWED) as renewed:
            lease = await Lock(client, name, ttl=scaled(0.6), replicas=1).acquire()
            assert await pair.on_replica(name) == lease.fencing_token
            chunks = [at for at, data in proxy.arrivals if at >= since and b"WAIT" in data]
            assert len(chunks) >= 1
            first = next(data for at, data in proxy.arrivals if at >= since and b"WAIT" in data)
            assert b"EVALSHA" in first, "the WAIT was not sent with the acquire"
            await eventually(
                lambda: len([e for e in renewed if e.name == name]) >= 3,
                what="three renewals confirmed by the replica",
                timeout=5.0,
            )
        await lease.release()
    finally:
        await client.aclose()
        await proxy.aclose()


async def test_a_paused_replica_refuses_acquires_and_lets_replicated_leases_lapse(
    pair: Pair, name: str
) -> None:
    """While the replica does not acknowledge (SIGSTOP): a `replicas=1` acquire raises and
    leaves nothing held; a `replicas=1` lease is lost at its deadline (its renewals land on
    the primary but are not confirmed), the cause a `ReplicationError`; a lease of the same
    client without `replicas` keeps renewing. Once the replica is back, acquires work."""
    client = client_of(pair.primary.port)
    stack = contextlib.ExitStack()
    try:
        replicated = await Lock(client, name, ttl=1.0, replicas=1).acquire()
        plain = await Lock(client, name + ":plain", ttl=1.0).acquire()
        failures = stack.enter_context(recorded(EventKind.RENEWAL_FAILED))
        pair.replica.pause()
        with pytest.raises(ReplicationError):
            await Lock(client, name + ":new", ttl=5, replicas=1).acquire(timeout=0)
        assert await pair.on_primary(name + ":new") is None, "the refused acquire stayed held"
        await within(replicated.wait_lost(), what="the unconfirmed lease's loss", timeout=5.0)
        assert replicated.loss_reason is LossReason.DEADLINE
        with pytest.raises(LeaseLostError) as info:
            await replicated.release()
        assert isinstance(info.value.__cause__, BackendError), repr(info.value.__cause__)
        # Its renewals were applied and answered, but not confirmed by the replica (the
        # last ones, with little time left, may also run out of time for WAIT's answer).
        causes = [e.error for e in failures if e.fencing_token == replicated.fencing_token]
        assert any(isinstance(error, ReplicationError) for error in causes), causes
        assert not plain.lost, "a lease without replicas= was lost with the other"
        await plain.release()
        pair.replica.resume()
        lease = await Lock(client, name + ":new", ttl=5, replicas=1).acquire(timeout=5)
        await lease.release()
    finally:
        stack.close()
        pair.replica.resume()
        await client.aclose()


async def test_a_hand_off_counts_only_once_the_replica_has_it(pair: Pair, name: str) -> None:
    """A lease handed to a waiter (another client: another process's queue) by a release
    is confirmed by the waiter (renewal + WAIT) before its body may run. With the replica
    acknowledging, the waiter gets it and the replica has its key; with the replica
    paused, the waiter's acquire raises and the lock is left free, not held by a lease
    nobody uses."""
    holder, waiter = client_of(pair.primary.port), client_of(pair.primary.port)
    keys = LockKeys.build("aiolock", name)
    try:
        for paused in (False, True):
            lease = await Lock(holder, name, ttl=5, replicas=1).acquire()
            # (a replica that acknowledges gets a second, so that a loaded machine's stall
            # does not pass for a paused replica)
            replica_timeout = 0.1 if paused else 1.0
            waiting = asyncio.ensure_future(
                Lock(waiter, name, ttl=5, replicas=1, replica_timeout=replica_timeout).acquire(
                    timeout=10
                )
            )
            await queued(holder, keys)
            if paused:
                pair.replica.pause()
            await lease.release()
            if not paused:
                handed = await within(waiting, what="the hand-off", timeout=5.0)
                assert await pair.on_replica(name) == handed.fencing_token
                await handed.release()
                continue
            with pytest.raises(ReplicationError):
                await within(waiting, what="the unconfirmed hand-off", timeout=5.0)
            assert await pair.on_primary(name) is None, "the unconfirmed grant stayed held"
            pair.replica.resume()
    finally:
        pair.replica.resume()
        await holder.aclose()
        await waiter.aclose()


# ------------------------------------------------------------------- through a failover
@pytest.fixture
async def proxied_group(binaries: list[ServerBinary]) -> AsyncIterator[tuple[SentinelGroup, Any]]:
    """A Sentinel group whose replica replicates through a fault proxy.

    The Sentinels would soon point the replica back at the master's own address (a replica
    "of the wrong master" is reconfigured once `failover-timeout` has passed), which would
    bypass the proxy: that timeout is longer than any test here."""
    with SentinelGroup(binaries[0], failover_timeout_ms=120_000) as group:
        assert group.replica is not None
        proxy = await FaultProxy(group.master.port).start()
        try:
            await _ask(group.replica.port, "REPLICAOF", "127.0.0.1", proxy.port)
            await group.ready()
            yield group, proxy
        finally:
            await proxy.aclose()


async def test_a_failover_loses_an_unreplicated_lock_but_not_one_taken_with_replicas(
    proxied_group: tuple[SentinelGroup, FaultProxy], name: str
) -> None:
    """The replica's link is held up (a lagging replica), then the Sentinels promote it.
    Without `replicas`, the acquire was granted on the master alone: after the failover a
    second client gets the same lock at once. With `replicas=1`, the acquire was refused
    (`ReplicationError`), so nothing ran under a lock the new master does not know."""
    group, proxy = proxied_group
    holder, other = group.master_client(), group.master_client()
    async with closing(holder, other):
        await group.replicated()
        proxy.blackhole()
        plain = await Lock(holder, name, ttl=10).acquire(timeout=0)
        with pytest.raises(ReplicationError):
            await Lock(holder, name + ":r", ttl=10, replicas=1, replica_timeout=0.2).acquire(
                timeout=0
            )
        await group.failover()
        second = await Lock(other, name, ttl=10).acquire(timeout=0)  # the loss, shown
        assert second.fencing_token != plain.fencing_token
        with contextlib.suppress(LeaseLostError):
            await plain.release()
        await second.release()
        await proxy.restore()


async def test_a_lock_taken_with_replicas_survives_an_immediate_failover(
    binaries: list[ServerBinary], name: str
) -> None:
    """`replicas=1`, then `SENTINEL FAILOVER` at once (no wait for replication): the new
    master has the key, so a second client finds the lock busy."""
    with SentinelGroup(binaries[0]) as group:
        await group.ready()
        holder, other = group.master_client(), group.master_client()
        async with closing(holder, other):
            await group.replicated()  # the replica acknowledges (after its sync, it may not)
            lease = await Lock(holder, name, ttl=10, replicas=1).acquire(timeout=0)
            new = await group.failover()
            assert await holder_on(new.port, name) == lease.fencing_token
            with pytest.raises(AcquireTimeoutError):
                await Lock(other, name, ttl=10).acquire(timeout=0)
            assert not lease.lost
            await lease.release()
            assert runtime_for(holder).backend.sentinel


async def test_after_a_failover_with_no_replica_left_a_replicated_lease_fails_closed(
    binaries: list[ServerBinary], name: str
) -> None:
    """With one replica, a failover leaves the new master without any until the Sentinels
    turn the former master into its replica (about ten seconds later; here it is paused
    first, so it never does). A `replicas=1` lease's renewals then land on the new master
    but cannot be confirmed: the lease is lost at its deadline (`DEADLINE`, the renewals'
    `ReplicationError` as the cause), its body told, rather than kept on a key that no
    replica has; meanwhile no second client gets the lock.

    The ttl (3 s, renewed every second) leaves each renewal a bound of about a second, of
    which its WAIT (0.1 s) takes a tenth, so an unacknowledged renewal says so in time.
    (With a 1.5 s ttl the renewals during the failover had bounds of 0.5, 0.2 and 0.07 s,
    half of each for WAIT and its answer up to 0.1 s late: on a loaded machine each could
    run out of time, and no `ReplicationError` was recorded.)"""
    with SentinelGroup(binaries[0]) as group:
        await group.ready()
        holder, other = group.master_client(), group.master_client()
        old = group.master
        async with closing(holder, other):
            await group.replicated()
            lock = Lock(holder, name, ttl=3, replicas=1, replica_timeout=0.1)
            lease = await lock.acquire(timeout=0)
            with recorded(EventKind.RENEWAL_FAILED) as failed:
                new = await group.failover()
                old.pause()  # it cannot become the new master's replica
                second = await Lock(other, name, ttl=3).try_acquire()
                assert second is None or lease.lost, "two holders at once"
                if second is not None:
                    await second.release()
                await within(lease.wait_lost(), what="the unconfirmed lease's loss", timeout=20.0)
            assert lease.loss_reason is LossReason.DEADLINE
            assert any(isinstance(e.error, ReplicationError) for e in failed), failed
            # The key itself is on the new master (renewed there, unconfirmed), until it
            # expires: nobody else gets in meanwhile.
            assert await holder_on(new.port, name) in (lease.fencing_token, None)
            with contextlib.suppress(LeaseLostError):
                await lease.release()
